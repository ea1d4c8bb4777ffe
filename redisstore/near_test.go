package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// nearStart is the tests' clock's start: inside a fixed window of a
// second, 100 ms after it begins.
var nearStart = time.Date(2026, 5, 1, 0, 10, 0, 100_000_000, time.UTC).UnixMicro()

// A refused key is refused without a call to Redis until the time Redis
// gave, and asked again from then on.
func TestNearCacheAnswersUntilRetryAfter(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p := floodgate.MustPolicy("near", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Second})
	ctx := context.Background()
	now := nearStart
	for i := range 3 {
		if d, err := s.Do(ctx, now, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
	}
	d, err := s.Do(ctx, now, p.Op(floodgate.OpAllow, "k", 1, 0))
	if err != nil || d.Allowed || d.RetryAfter != 900*time.Millisecond {
		t.Fatalf("the 4th: %+v %v, want refused for 900ms", d, err)
	}
	before := fcalls(t, srv.Addr)
	for i := range 100 {
		at := now + int64(i)*8999 // up to 890.9 ms on
		d, err := s.Do(ctx, at, p.Op(floodgate.OpAllow, "k", 1, 0))
		want := time.Duration(nearStart+900_000-at) * time.Microsecond
		if err != nil || d.Allowed || d.Degraded || d.RetryAfter != want || d.Limit != 3 || d.Reason != floodgate.ReasonLimited || d.Rule == "" {
			t.Fatalf("at +%dµs: %+v %v, want refused with RetryAfter %v", at-now, d, err, want)
		}
	}
	if n := fcalls(t, srv.Addr) - before; n != 0 {
		t.Errorf("100 refusals known to the near cache took %d calls, want 0", n)
	}
	if st := s.Stats(); st.NearHits != 100 {
		t.Errorf("NearHits %d, want 100", st.NearHits)
	}
	// at T the window has rolled: Redis is asked, and admits
	d, err = s.Do(ctx, nearStart+900_000, p.Op(floodgate.OpAllow, "k", 1, 0))
	if err != nil || !d.Allowed {
		t.Fatalf("at T: %+v %v, want admitted", d, err)
	}
	if n := fcalls(t, srv.Addr) - before; n != 1 {
		t.Errorf("at T: %d calls, want 1", n)
	}
}

// With the near cache off, every refusal is a call.
func TestNearCacheOff(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second, NoNearCache: true})
	p := floodgate.MustPolicy("near", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Second})
	ctx := context.Background()
	before := fcalls(t, srv.Addr)
	for range 10 {
		if _, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if n := fcalls(t, srv.Addr) - before; n != 10 {
		t.Errorf("10 decisions took %d calls, want 10", n)
	}
	if st := s.Stats(); st.NearHits != 0 {
		t.Errorf("NearHits %d, want 0", st.NearHits)
	}
}

// Only requests of cost 1 are answered: a refusal of a costly request is
// not kept (a cheaper one may fit, and a costlier one waits longer), and a
// costly request on a key known refused goes to Redis.
func TestNearCacheCostOneOnly(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p := floodgate.MustPolicy("near", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 10, Period: time.Second})
	ctx := context.Background()
	if d, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 7, 0)); err != nil || !d.Allowed {
		t.Fatalf("7 of 10: %+v %v", d, err)
	}
	before := fcalls(t, srv.Addr)
	for range 2 {
		if d, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 5, 0)); err != nil || d.Allowed {
			t.Fatalf("5 more: %+v %v, want refused", d, err)
		}
	}
	for i := range 3 {
		d, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0))
		if err != nil || !d.Allowed {
			t.Fatalf("cheap request %d: %+v %v, want admitted (3 of 10 left)", i, d, err)
		}
	}
	if n := fcalls(t, srv.Addr) - before; n != 5 {
		t.Errorf("2 costly refusals and 3 cheap admissions took %d calls, want 5", n)
	}
	for range 2 { // refused, then known refused
		if d, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil || d.Allowed {
			t.Fatalf("the 11th: %+v %v, want refused", d, err)
		}
	}
	if d, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 2, 0)); err != nil || d.Allowed || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("cost 2: %+v %v, want refused for 200ms", d, err)
	}
	if n := fcalls(t, srv.Addr) - before; n != 7 {
		t.Errorf("%d calls, want 7 (the second refusal of cost 1 answered here)", n)
	}
}

// A refund (or a charge, or a reset) through the store drops the key's
// refusal: the next request asks Redis.
func TestNearCacheRefundAsksRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p := floodgate.MustPolicy("near", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Second})
	ctx := context.Background()
	for range 3 {
		if _, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Do(ctx, nearStart, p.Op(floodgate.OpRefund, "k", 1, 0)); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil || !d.Allowed {
		t.Fatalf("after a refund: %+v %v, want admitted", d, err)
	}
	// a new version of the policy is never answered by the old one's refusal
	if _, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil {
		t.Fatal(err)
	}
	q, err := p.WithLimit(p.Rules()[0].Name, 5)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := s.Do(ctx, nearStart, q.Op(floodgate.OpAllow, "k", 1, 0)); err != nil || !d.Allowed {
		t.Fatalf("under a limit of 5: %+v %v, want admitted", d, err)
	}
}

// Policies whose refusals count (a sliding log with CountRejected) or
// whose capacity moves (elastic) always ask Redis.
func TestNearCacheBypassed(t *testing.T) {
	spare := false
	for _, tc := range []struct {
		name string
		rule floodgate.Rule
	}{
		{"count_rejected", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Second, CountRejected: true}},
		{"elastic", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Second,
			Mode: floodgate.Elastic, ElasticCeiling: 4, Spare: func() bool { return spare }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
			p := floodgate.MustPolicy("bypass", tc.rule, floodgate.Rule{Name: "other", Limit: 100, Period: time.Second})
			ctx := context.Background()
			before := fcalls(t, srv.Addr)
			for range 10 {
				if _, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil {
					t.Fatal(err)
				}
			}
			if n := fcalls(t, srv.Addr) - before; n != 10 {
				t.Errorf("10 decisions took %d calls, want 10", n)
			}
			if st := s.Stats(); st.NearHits != 0 {
				t.Errorf("NearHits %d, want 0", st.NearHits)
			}
		})
	}
}

// A batch's ops that the near cache knows refused are answered here, the
// others asked of Redis, each decision in its place.
func TestNearCacheBatch(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p := floodgate.MustPolicy("near", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Second})
	ctx := context.Background()
	ops := make([]floodgate.Op, 6)
	for i := range ops {
		ops[i] = p.Op(floodgate.OpAllow, fmt.Sprint("k", i%3), 1, 0)
	}
	out := make([]floodgate.Decision, len(ops))
	if err := s.DoBatch(ctx, nearStart, ops, out); err != nil { // k0..k2 admitted, then refused
		t.Fatal(err)
	}
	for i, d := range out {
		if d.Allowed != (i < 3) {
			t.Fatalf("decision %d: %+v", i, d)
		}
	}
	ops = append(ops, p.Op(floodgate.OpAllow, "fresh", 1, 0))
	out = make([]floodgate.Decision, len(ops))
	before := fcalls(t, srv.Addr)
	if err := s.DoBatch(ctx, nearStart+1000, ops, out); err != nil {
		t.Fatal(err)
	}
	for i, d := range out {
		if d.Allowed != (i == 6) || d.Degraded {
			t.Fatalf("decision %d: %+v", i, d)
		}
		if !d.Allowed && d.RetryAfter != 899*time.Millisecond {
			t.Errorf("decision %d: RetryAfter %v, want 899ms", i, d.RetryAfter)
		}
	}
	if n := fcalls(t, srv.Addr) - before; n != 1 {
		t.Errorf("the batch took %d calls, want 1 (for the one key not known refused)", n)
	}
	if st := s.Stats(); st.NearHits != 6 {
		t.Errorf("NearHits %d, want 6", st.NearHits)
	}
}

// A flood of distinct refused keys leaves the near cache at its fixed size.
func TestNearCacheBounded(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p := floodgate.MustPolicy("near", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Second})
	n := redisstore.NearFill(s, p, 1_000_000, nearStart)
	if n != redisstore.NearSlots {
		t.Errorf("after 1M refused keys the near cache holds %d entries, want its %d slots", n, redisstore.NearSlots)
	}
}

// BenchmarkNearCacheRefused is one caller's Do on a key Redis refuses for
// the benchmark's whole run (a fixed window of an hour, spent), with the
// near cache (answered in process) and without (a call each): what a
// refused decision costs the caller, and the near cache's lookup on the
// hot path.
//
//	go test -run '^$' -bench NearCacheRefused ./redisstore
func BenchmarkNearCacheRefused(b *testing.B) {
	srv := redistest.Standalone(b)
	for _, off := range []bool{false, true} {
		b.Run(fmt.Sprintf("near=%v", !off), func(b *testing.B) {
			s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second, NoNearCache: off})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			p := floodgate.MustPolicy(fmt.Sprintf("bench%v", off), floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Hour})
			ctx := context.Background()
			op := p.Op(floodgate.OpAllow, "hot", 1, 0)
			for range 2 { // admitted, then refused (and known refused)
				if _, err := s.Do(ctx, nearStart, op); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if d, err := s.Do(ctx, nearStart, op); err != nil || d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
			b.StopTimer()
			st := s.Stats()
			b.ReportMetric(float64(st.Calls)/float64(b.N+2), "calls/op")
		})
	}
}

// While Redis is down, a key Redis refused stays refused until the time
// Redis gave; any other key is decided by its rules' failure modes (here
// open: admitted).
func TestNearCacheWhileRedisIsDown(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: time.Second})
	p := floodgate.MustPolicy("near", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Hour, OnStoreFailure: floodgate.FailOpen})
	ctx := context.Background()
	for range 2 {
		if _, err := s.Do(ctx, nearStart, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	for range 5 {
		if d, err := s.Do(ctx, nearStart+1000, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil || d.Allowed || d.Degraded {
			t.Fatalf("the key refused: %+v %v, want refused as Redis said", d, err)
		}
		if d, err := s.Do(ctx, nearStart+1000, p.Op(floodgate.OpAllow, "other", 1, 0)); err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("another key: %+v %v, want admitted by the failure mode", d, err)
		}
	}
}
