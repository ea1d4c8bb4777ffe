package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// The worked examples of the seed articles (/work/shared/seeds), as written.
// Where an example holds only under one reading, the test takes that
// reading and says why.

const (
	allow   = floodgate.OpAllow
	peek    = floodgate.OpPeek
	charge  = floodgate.OpCharge
	refund  = floodgate.OpRefund
	reserve = floodgate.OpReserve
	reset   = floodgate.OpReset
)

func testSeeds(t *testing.T, newStore NewStore) {
	// Seed 000: 3 requests per minute, requests at 0, 10, 30 and 55 s.
	// The article's narrative (2 tokens left at 10 s, 1 at 30 s, "the
	// bucket is empty for exactly 1 minute", the fourth request throttled,
	// the bucket full again "at the completion of that 1 minute") is a
	// bucket refilled all at once per period: Refill: RefillInterval, the
	// period starting with the first request taken from a full bucket, so
	// the bucket is full again at 60 s.
	t.Run("TokenBucket3PerMinute/Interval", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Limit: 3, Period: time.Minute, Refill: floodgate.RefillInterval})
		const r = "3/1m0s" // the default rule name
		e.script(l, "user1", []step{
			{0, allow, 1, ok(r, 3, 2, 60*time.Second)},
			{10 * time.Second, allow, 1, ok(r, 3, 1, 50*time.Second)},
			{30 * time.Second, allow, 1, ok(r, 3, 0, 30*time.Second)},
			// Throttled: the 429 of the article, retry when the minute ends.
			{55 * time.Second, allow, 1, no(r, 3, 0, 5*time.Second, 5*time.Second)},
			{59*time.Second + 999999*time.Microsecond, allow, 1, no(r, 3, 0, us(1), us(1))},
			// "At the completion of that 1 minute ... the bucket is again
			// full of 3 tokens": a new period starts with this request.
			{60 * time.Second, allow, 1, ok(r, 3, 2, 60*time.Second)},
			{60 * time.Second, allow, 1, ok(r, 3, 1, 60*time.Second)},
			{60 * time.Second, allow, 1, ok(r, 3, 0, 60*time.Second)},
			{60 * time.Second, allow, 1, no(r, 3, 0, 60*time.Second, 60*time.Second)},
		})
	})
	// The same requests on a continuously refilled bucket (the default,
	// and the article's code sample): one token every 20 s, so 1.5 tokens
	// are back by 30 s and the fourth request at 55 s is admitted. The
	// article's narrative does not hold under this reading; this test pins
	// the continuous reading's exact numbers instead.
	t.Run("TokenBucket3PerMinute/Continuous", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Limit: 3, Period: time.Minute})
		const r = "3/1m0s"
		e.script(l, "user1", []step{
			// One request is 20 s of refill: reset is when the bucket is full.
			{0, allow, 1, ok(r, 3, 2, 20*time.Second)},
			// 0.5 token came back: 1.5 left after this one, 1 whole.
			{10 * time.Second, allow, 1, ok(r, 3, 1, 30*time.Second)},
			{30 * time.Second, allow, 1, ok(r, 3, 1, 30*time.Second)},
			// 1.25 tokens refilled since 30 s: admitted, 1.75 tokens left.
			{55 * time.Second, allow, 1, ok(r, 3, 1, 25*time.Second)},
		})
	})

	// Seed 001: "Kristie", 3 requests per minute, fixed windows starting on
	// the minute (StartTime 1499828400 is 03:00:00 UTC).
	t.Run("FixedWindowKristie", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
		const r = "3/1m0s"
		e.script(l, "Kristie", []step{
			{0, allow, 1, ok(r, 3, 2, 60*time.Second)},                                            // 03:00:00 insert, allow
			{10 * time.Second, allow, 1, ok(r, 3, 1, 50*time.Second)},                             // 03:00:10 increment, allow
			{65 * time.Second, allow, 1, ok(r, 3, 2, 55*time.Second)},                             // 03:01:05 reset count and start, allow
			{80 * time.Second, allow, 1, ok(r, 3, 1, 40*time.Second)},                             // 03:01:20 allow
			{105 * time.Second, allow, 1, ok(r, 3, 0, 15*time.Second)},                            // 03:01:45 allow
			{110 * time.Second, allow, 1, no(r, 3, 0, 10*time.Second, 10*time.Second)},            // 03:01:50 reject
			{120 * time.Second, allow, 1, ok(r, 3, 2, 60*time.Second)},                            // 03:02:00 a new minute
			{120 * time.Second, floodgate.OpPeek, 0, ok(r, 3, 2, 60*time.Second)},                 // peeking consumes nothing
			{179*time.Second + 999999*time.Microsecond, allow, 2, ok(r, 3, 0, us(1))},             // the last microsecond
			{180 * time.Second, floodgate.OpPeek, 0, ok(r, 3, 3, 0)},                              // fresh
			{180 * time.Second, floodgate.OpPeek, 4, tooLarge(r, 3, 3, 0)},                        // never fits
			{180 * time.Second, floodgate.OpPeek, 3, ok(r, 3, 3, 0)},                              // fits, not taken
			{180 * time.Second, allow, 3, ok(r, 3, 0, 60*time.Second)},                            // taken
			{180 * time.Second, floodgate.OpPeek, 1, no(r, 3, 0, 60*time.Second, 60*time.Second)}, // and gone
		})
	})

	// Seed 001: fixed versus rolling window at 2 messages per second, with
	// m1, m2 in the first second and m3, m4, m5 in the second. The times are
	// chosen to fit the text: m1 at 0.3 s and m2 at 0.4 s ("the 300th
	// millisecond and 400th millisecond"), m3 at 1.1 s, m4 at 1.2 s, m5 at
	// 1.9 s. A fixed window throttles only m5 (the third in [1 s, 2 s)).
	// A rolling window throttles m3 and m4 (m1 and m2 are within the last
	// second) and admits m5: by 1.9 s m1 and m2 have left the window and
	// the throttled m3 and m4 do not count. That last point holds only for
	// a log of admitted requests; with CountRejected the throttled m3 and
	// m4 are in the log and m5 is throttled too, which the article does not
	// say, so its rolling window is the sliding log without CountRejected.
	msgs := []time.Duration{300 * time.Millisecond, 400 * time.Millisecond, 1100 * time.Millisecond, 1200 * time.Millisecond, 1900 * time.Millisecond}
	t.Run("FixedVersusRolling/Fixed", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Second})
		const r = "2/1s"
		e.script(l, "user", []step{
			{msgs[0], allow, 1, ok(r, 2, 1, 700*time.Millisecond)},
			{msgs[1], allow, 1, ok(r, 2, 0, 600*time.Millisecond)},
			{msgs[2], allow, 1, ok(r, 2, 1, 900*time.Millisecond)},
			{msgs[3], allow, 1, ok(r, 2, 0, 800*time.Millisecond)},
			{msgs[4], allow, 1, no(r, 2, 0, 100*time.Millisecond, 100*time.Millisecond)}, // only m5
		})
	})
	t.Run("FixedVersusRolling/Rolling", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Second})
		const r = "2/1s"
		e.script(l, "user", []step{
			{msgs[0], allow, 1, ok(r, 2, 1, time.Second)},
			{msgs[1], allow, 1, ok(r, 2, 0, time.Second)},
			// m1 leaves the window at 1.3 s: "from the 300th millisecond of
			// that second up to the 300th millisecond of next second".
			{msgs[2], allow, 1, no(r, 2, 0, 300*time.Millisecond, 200*time.Millisecond)}, // m3
			{msgs[3], allow, 1, no(r, 2, 0, 200*time.Millisecond, 100*time.Millisecond)}, // m4
			{msgs[4], allow, 1, ok(r, 2, 1, time.Second)},                                // m5
		})
	})
	t.Run("FixedVersusRolling/RollingCountRejected", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Second, CountRejected: true})
		const r = "2/1s"
		e.script(l, "user", []step{
			{msgs[0], allow, 1, ok(r, 2, 1, time.Second)},
			{msgs[1], allow, 1, ok(r, 2, 0, time.Second)},
			// m3 is logged: the log's newest two are 0.4 s and 1.1 s.
			{msgs[2], allow, 1, no(r, 2, 0, time.Second, 300*time.Millisecond)},
			{msgs[3], allow, 1, no(r, 2, 0, time.Second, 900*time.Millisecond)},
			{msgs[4], allow, 1, no(r, 2, 0, time.Second, 300*time.Millisecond)},
		})
	})

	// Seeds 000 and 003: a sliding log of 2 per minute, requests at
	// 1:00:01, 1:00:30, 1:00:50 and 1:01:40. The articles keep the rejected
	// 1:00:50 in the log ("the timestamp is still present in the log") and
	// find the log at size 2 after the 1:01:40 request: that is
	// CountRejected. Without it the 1:00:50 request is not logged; the
	// decisions are the same, but the log holds only the 1:01:40 request
	// afterwards (Remaining 1, not 0) and the rejected request's retry-after
	// is counted from the admitted ones.
	t.Run("SlidingLog2PerMinute/CountRejected", func(t *testing.T) {
		e := newEnv(t, newStore)
		e.from(time.Date(2017, 7, 12, 1, 0, 0, 0, time.UTC))
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Minute, CountRejected: true})
		const r = "2/1m0s"
		e.script(l, "user", []step{
			{1 * time.Second, allow, 1, ok(r, 2, 1, 60*time.Second)},
			{30 * time.Second, allow, 1, ok(r, 2, 0, 60*time.Second)},
			// Rejected and logged: the next request fits once 1:00:30 leaves
			// the window, at 1:01:30.
			{50 * time.Second, allow, 1, no(r, 2, 0, 60*time.Second, 40*time.Second)},
			// 1:00:01 and 1:00:30 are outside [1:00:40, 1:01:40); 1:00:50 is
			// not: the log holds two, the limit.
			{100 * time.Second, allow, 1, ok(r, 2, 0, 60*time.Second)},
		})
	})
	t.Run("SlidingLog2PerMinute/AdmittedOnly", func(t *testing.T) {
		e := newEnv(t, newStore)
		e.from(time.Date(2017, 7, 12, 1, 0, 0, 0, time.UTC))
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Minute})
		const r = "2/1m0s"
		e.script(l, "user", []step{
			{1 * time.Second, allow, 1, ok(r, 2, 1, 60*time.Second)},
			{30 * time.Second, allow, 1, ok(r, 2, 0, 60*time.Second)},
			// Not logged: the next request fits when 1:00:01 leaves, at
			// 1:01:01; the state is fresh when 1:00:30 leaves, at 1:01:30.
			{50 * time.Second, allow, 1, no(r, 2, 0, 40*time.Second, 11*time.Second)},
			{100 * time.Second, allow, 1, ok(r, 2, 1, 60*time.Second)},
		})
	})

	// Seed 003: sliding window counter, 7 per minute, 5 requests in the
	// previous minute and 3 in the current one; a request at 30% of the
	// current minute counts 3 + 5×0.7 = 6.5 requests, "rounded down" 6,
	// and is admitted. Exactly, 6.5 + 1 > 7 would reject it: the example
	// holds only with the previous window's weighted count rounded down,
	// which is the reading tested.
	t.Run("SlidingWindow7PerMinute", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.SlidingWindow, Limit: 7, Period: time.Minute})
		const r = "7/1m0s"
		const m = time.Minute
		var steps []step
		// The previous minute: 5 requests (its own previous minute empty).
		// k requests in the current window are forgotten once their weight
		// floor(k(60-e)/60) is 0 in the next window: from e = 60-ceil(60/k)
		// seconds and 1 µs.
		forgotten := []time.Duration{us(1), 30*time.Second + us(1), 40*time.Second + us(1), 45*time.Second + us(1), 48*time.Second + us(1)}
		for i := range 5 {
			at := time.Duration(10*(i+1)) * time.Second
			steps = append(steps, step{at, allow, 1, ok(r, 7, int64(6-i), m+forgotten[i]-at)})
		}
		steps = append(steps,
			// 1 s in: 0 + floor(5×59/60) = 4 counted; after this one 5.
			// Reset: one request's weight floor(1×(60-e)/60) is 0 from e = 1 µs.
			step{m + 1*time.Second, allow, 1, ok(r, 7, 2, 59*time.Second+us(1))},
			// 2 s in: 1 + floor(5×58/60) = 5; after 6. Two requests are
			// forgotten when floor(2(60-e)/60) = 0, e > 30 s.
			step{m + 2*time.Second, allow, 1, ok(r, 7, 1, 88*time.Second+us(1))},
			// 3 s in: 2 + floor(5×57/60) = 6; after 7.
			step{m + 3*time.Second, allow, 1, ok(r, 7, 0, 97*time.Second+us(1))},
			// 18 s in (30%): 3 + floor(5×42/60 = 3.5) = 6 < 7: admitted.
			step{m + 18*time.Second, allow, 1, ok(r, 7, 0, 87*time.Second+us(1))},
			// Now 4 + 3 = 7: rejected until floor(5(60-e)/60) <= 2, e > 24 s.
			step{m + 18*time.Second, allow, 1, no(r, 7, 0, 87*time.Second+us(1), 6*time.Second+us(1))},
			step{m + 24*time.Second, allow, 1, no(r, 7, 0, 81*time.Second+us(1), us(1))},
			// Five in the current window are forgotten when floor(5(60-e)/60)
			// = 0, e > 48 s into the next.
			step{m + 24*time.Second + us(1), allow, 1, ok(r, 7, 0, 84*time.Second)},
		)
		e.script(l, "user", steps)
	})

	// Seed 002: a leaky bucket of capacity 10 leaking 2 per second, and a
	// spike of 20 requests at once. As a queue (the shaper), the first 10
	// are queued and leave every half second; the other 10 are rejected
	// until there is room.
	t.Run("LeakyBucketSpike/Shaper", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.LeakyBucketShaper, Limit: 2, Period: time.Second, Burst: 10})
		const r = "2/1s"
		var steps []step
		for i := range 20 {
			want := delayed(ok(r, 2, int64(9-i), time.Duration(i+1)*500*time.Millisecond), time.Duration(i)*500*time.Millisecond)
			if i >= 10 {
				// Rejected: the queue is full; a request goes through
				// without waiting once it is empty.
				want = no(r, 2, 0, 5*time.Second, 5*time.Second)
			}
			steps = append(steps, step{0, reserve, 1, want})
		}
		steps = append(steps,
			// Allow admits only into an empty queue.
			step{0, allow, 1, no(r, 2, 0, 5*time.Second, 5*time.Second)},
			// Half a second later one request has left: room for one, which
			// leaves at 5 s, after the other nine.
			step{500 * time.Millisecond, reserve, 1, delayed(ok(r, 2, 0, 5*time.Second), 4500*time.Millisecond)},
			step{500 * time.Millisecond, reserve, 1, no(r, 2, 0, 5*time.Second, 5*time.Second)},
			// At 2.5 s the queue holds 6: room for 4, empty in 3 s.
			step{2500 * time.Millisecond, peek, 0, ok(r, 2, 4, 3*time.Second)},
			// The last request leaves at 5 s and takes until 5.5 s: until then
			// the queue is not empty and Allow rejects.
			step{5 * time.Second, allow, 1, no(r, 2, 9, 500*time.Millisecond, 500*time.Millisecond)},
			step{5500 * time.Millisecond, allow, 1, ok(r, 2, 9, 500*time.Millisecond)},
		)
		e.script(l, "spike", steps)
	})
	// As a meter: the first 10 fill the bucket, the other 10 overflow and
	// are rejected, and 2 more fit each second as it leaks.
	t.Run("LeakyBucketSpike/Meter", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.LeakyBucket, Limit: 2, Period: time.Second, Burst: 10})
		const r = "2/1s"
		var steps []step
		for i := range 20 {
			want := ok(r, 2, int64(9-i), time.Duration(i+1)*500*time.Millisecond)
			if i >= 10 {
				want = no(r, 2, 0, 5*time.Second, 500*time.Millisecond)
			}
			steps = append(steps, step{0, allow, 1, want})
		}
		for s := 1; s <= 6; s++ {
			at := time.Duration(s) * time.Second
			steps = append(steps,
				step{at, allow, 1, ok(r, 2, 1, 4500*time.Millisecond)},
				step{at, allow, 1, ok(r, 2, 0, 5*time.Second)},
				step{at, allow, 1, no(r, 2, 0, 5*time.Second, 500*time.Millisecond)},
			)
		}
		e.script(l, "spike", steps)
	})

	// Seed 001: 500 requests per hour counted in per-minute sub-windows,
	// plus 10 requests per minute, for one user. All or nothing: a request
	// one rule rejects consumes nothing from the other.
	t.Run("HourAndMinute", func(t *testing.T) {
		e := newEnv(t, newStore)
		hour := floodgate.Rule{Name: "hour", Algorithm: floodgate.SlidingSubwindow, Limit: 500, Period: time.Hour, Granularity: time.Minute}
		minute := floodgate.Rule{Name: "minute", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute}
		l := e.limiter("p", hour, minute)
		// 15 requests a minute, 2 s apart: the minute rule admits 10 and
		// rejects 5. Had the rejected ones counted against the hour, the
		// hour would be spent in minute 34; it is spent by the 500th
		// admission, in minute 49.
		for m := range 50 {
			for i := range 15 {
				e.at(time.Duration(m)*time.Minute + time.Duration(2*i)*time.Second)
				off := time.Duration(2*i) * time.Second
				var want floodgate.Decision
				switch {
				case i < 10 && m < 49:
					want = ok("minute", 10, int64(9-i), time.Minute-off)
				case i < 10:
					// As few remain of the hour as of the minute: the rule
					// whose state lasts longer reports.
					want = ok("hour", 500, int64(9-i), time.Hour-off)
				case m < 49:
					want = no("minute", 10, 0, time.Minute-off, time.Minute-off)
				default:
					// Both reject: the longer wait reports, until minute 0's
					// requests leave the hour at 60:00.
					want = no("hour", 500, 0, time.Hour-off, 11*time.Minute-off)
				}
				e.expect(fmt.Sprintf("minute %d request %d", m, i), e.allow(l, "Kristie"), want)
			}
		}
		// Minute 50: the hour rejects, though the minute has room.
		for i := range 10 {
			e.at(50 * time.Minute)
			e.expect(fmt.Sprintf("minute 50 request %d", i), e.allow(l, "Kristie"), no("hour", 500, 0, 59*time.Minute, 10*time.Minute))
		}
		// Raise the hourly limit (consumption is kept): the minute's 10 are
		// all there, since the hour's rejections consumed none of them.
		if err := l.SetLimit("hour", 1000); err != nil {
			t.Fatal(err)
		}
		e.at(50*time.Minute + 30*time.Second)
		for i := range 10 {
			e.expect(fmt.Sprintf("minute 50 after the change, request %d", i), e.allow(l, "Kristie"), ok("minute", 10, int64(9-i), 30*time.Second))
		}
		e.expect("minute 50, 11th", e.allow(l, "Kristie"), no("minute", 10, 0, 30*time.Second, 30*time.Second))
		// Minute 60: minute 0's 10 requests left the hour; 510 remain in it.
		e.at(60 * time.Minute)
		e.expect("minute 60", e.peek(l, "Kristie", 0), ok("minute", 10, 10, 0))
		// With a minute limit above the hour's room, the hour reports: 500
		// remain of 1000, and minute 50's requests leave at 110:00.
		if err := l.SetLimit("minute", 600); err != nil {
			t.Fatal(err)
		}
		e.expect("minute 60, hour", e.peek(l, "Kristie", 0), ok("hour", 1000, 500, 50*time.Minute))
	})
}
