package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// The lag monitor records a wake-up that came late as a stall, from when
// it was due to when it came, and counts a wake-up still owed (the monitor
// itself starved) up to the moment asked about; on-time wake-ups are not
// stalls. The clock is manual: a late wake-up is the clock moved past the
// monitor's sleep.
func TestLagMonitorStalls(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewManual(t0)
	m := newLagMonitor(clk)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	ticks := 0
	go func() { defer close(done); m.run(ctx, func() { ticks++ }, nil) }()
	defer func() { cancel(); <-done }()
	asleep := func() {
		t.Helper()
		if err := clk.WaitForSleepers(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	us := func(d time.Duration) int64 { return t0.Add(d).UnixMicro() }

	asleep()
	for range 10 { // on time: no stall
		clk.Advance(lagEvery)
		asleep()
	}
	if got := m.starved(us(0), us(50*time.Millisecond)); got != 0 {
		t.Fatalf("wake-ups on time: %v starved, want 0", got)
	}
	// the next wake-up (due at 55ms) comes at 135ms: a stall of 80ms
	clk.Advance(lagEvery + 80*time.Millisecond)
	asleep()
	for _, c := range []struct {
		from, to time.Duration
		want     time.Duration
	}{
		{0, 135 * time.Millisecond, 80 * time.Millisecond},
		{100 * time.Millisecond, 120 * time.Millisecond, 20 * time.Millisecond},
		{0, 60 * time.Millisecond, 5 * time.Millisecond},
		{135 * time.Millisecond, 135 * time.Millisecond, 0},
		{0, 55 * time.Millisecond, 0},
	} {
		if got := m.starved(us(c.from), us(c.to)); got != c.want {
			t.Errorf("starved over [%v, %v]: %v, want %v", c.from, c.to, got, c.want)
		}
	}
	// asked about a time the monitor should have woken by (due at 140ms)
	// and has not: the wake-up it owes counts
	if got := m.starved(us(135*time.Millisecond), us(200*time.Millisecond)); got != 60*time.Millisecond {
		t.Errorf("a wake-up owed by 60ms: %v starved, want 60ms", got)
	}
	// less than lagMinStall late is not a stall, owed or not
	if got := m.starved(us(135*time.Millisecond), us(140*time.Millisecond)+lagMinStall.Microseconds()-1); got != 0 {
		t.Errorf("a wake-up owed by less than %v: %v starved, want 0", lagMinStall, got)
	}
	// Stats.Lag: the worst stall of the last refresh period
	for range refreshEvery {
		clk.Advance(lagEvery)
		asleep()
	}
	if got := time.Duration(m.lag.Load()) * time.Microsecond; got != 80*time.Millisecond {
		t.Errorf("lag reported %v, want the 80ms stall", got)
	}
	if ticks == 0 {
		t.Error("the monitor never called its refresh")
	}
}

// The adaptive timeout is three times the p99 of the last 5 s of
// latencies, to a bucket (12%), between its floor and ceiling; with no
// samples for 5 s it is the floor again.
func TestAdaptiveTimeout(t *testing.T) {
	a := newAdaptive(50*time.Millisecond, time.Second)
	if a.timeout() != 50*time.Millisecond {
		t.Fatalf("start: %v, want the floor", a.timeout())
	}
	fill := func(n int, lat time.Duration) {
		for range n {
			a.observe(lat.Microseconds())
		}
	}
	fill(1000, 2*time.Millisecond) // healthy: 3×2ms is under the floor
	a.refresh()
	if a.timeout() != 50*time.Millisecond {
		t.Fatalf("2ms calls: %v, want the 50ms floor", a.timeout())
	}
	fill(1000, 100*time.Millisecond) // half the calls take 100ms
	a.refresh()
	if got := a.timeout(); got < 300*time.Millisecond || got > 345*time.Millisecond {
		t.Fatalf("p99 of 100ms: %v, want 300ms to 345ms", got)
	}
	fill(5, 900*time.Millisecond) // 5 in 2005: under 1%, not the p99
	a.refresh()
	if got := a.timeout(); got > 345*time.Millisecond {
		t.Fatalf("a tail under 1%%: %v, want the p99's 300ms to 345ms", got)
	}
	fill(100, 2*time.Second)
	a.refresh()
	if got := a.timeout(); got != time.Second {
		t.Fatalf("p99 of 2s: %v, want the 1s ceiling", got)
	}
	for range adaptWindows - 1 {
		a.refresh()
	}
	if got := a.timeout(); got != time.Second {
		t.Fatalf("after %v: %v, want the last 5s's samples still counted", (adaptWindows-1)*adaptWindow, got)
	}
	a.refresh()
	if got := a.timeout(); got != 50*time.Millisecond {
		t.Fatalf("after 5s without samples: %v, want the floor", got)
	}
	for _, us := range []int64{-1, 0, 7, 8, 1000, 50_000, 1 << 35, 1 << 40} {
		if b := latBucket(us); b < 0 || b >= adaptBuckets || us >= 0 && us < 1<<35 && us >= latUpper(b) {
			t.Errorf("latency %dµs: bucket %d (upper %d)", us, b, latUpper(b))
		}
	}
}

// The host's CPU pressure over a span is read from PSI's stall total,
// interpolated between readings and extrapolated past the last at the
// last rate, at most the span.
func TestHostPressure(t *testing.T) {
	var total int64
	h := &hostPressure{read: func() (int64, bool) { return total, true }}
	if got := h.starved(0, 1000); got != 0 {
		t.Fatalf("no readings: %v, want 0", got)
	}
	ms := int64(1000) // µs
	// 0-100ms: idle; 100-200ms: some task always waiting; 200-300ms: a
	// quarter of the time
	for _, r := range []struct{ at, total int64 }{{0, 0}, {50, 0}, {100, 0}, {150, 50}, {200, 100}, {250, 112}, {300, 125}} {
		total = r.total * ms
		h.sample(r.at * ms)
	}
	for _, c := range []struct {
		from, to int64 // ms
		want     time.Duration
	}{
		{0, 100, 0},
		{100, 200, 100 * time.Millisecond},
		{120, 130, 10 * time.Millisecond},
		{90, 110, 10 * time.Millisecond},
		{200, 300, 25 * time.Millisecond},
		{300, 340, 10 * time.Millisecond}, // past the last reading, at its rate
		{-100, 50, 0},
		{150, 150, 0},
	} {
		got := h.starved(c.from*ms, c.to*ms)
		if d := got - c.want; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("host stalled over [%dms, %dms]: %v, want %v", c.from, c.to, got, c.want)
		}
	}
	// the ring keeps the last pressureRing readings, in order
	for i := range 3 * pressureRing {
		total = int64(i) * 50 * ms / 2 // half the time from here on
		h.sample(int64(400+50*i) * ms)
	}
	end := int64(400+50*(3*pressureRing-1)) * ms
	if got := h.starved(end-1000*ms, end); got < 499*time.Millisecond || got > 501*time.Millisecond {
		t.Errorf("a second at half pressure: %v, want 500ms", got)
	}
}

func TestParsePressure(t *testing.T) {
	for in, want := range map[string]int64{
		"some avg10=98.96 avg60=99.00 avg300=97.32 total=1210249159\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n": 1210249159,
		"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n":                                                             0,
		"full avg10=0.00 total=5\n": -1,
		"some avg10=0.00\n":         -1,
		"some total=x\n":            -1,
		"":                          -1,
	} {
		got, ok := parsePressure([]byte(in))
		if want < 0 && ok || want >= 0 && (!ok || got != want) {
			t.Errorf("parsePressure(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
}

func TestOnThisHost(t *testing.T) {
	for _, c := range []struct {
		addrs []string
		want  bool
	}{
		{[]string{"127.0.0.1:6379"}, true},
		{[]string{"[::1]:6379", "localhost:7000"}, true},
		{[]string{"/var/run/redis.sock"}, true},
		{[]string{"127.0.0.1:6379", "10.0.0.5:6379"}, false},
		{[]string{"redis.internal:6379"}, false},
		{nil, false},
	} {
		if got := onThisHost(c.addrs); got != c.want {
			t.Errorf("onThisHost(%q) = %v, want %v", c.addrs, got, c.want)
		}
	}
}
