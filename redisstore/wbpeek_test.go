package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// A peek on a write-back key sees the node's own unsynced hits: Remaining
// counts them, a PeekN that only fits without them is refused, and in a
// batch too; the peek consumes nothing (Redis's count afterwards is what
// was admitted).
func TestWriteBackPeekSeesUnsyncedHits(t *testing.T) {
	srv := redistest.Standalone(t)
	const limit = 1000
	pol := wbPolicy(t, floodgate.FixedWindow, limit, 0.5, floodgate.FailClosed) // N = 500: no sync before 250
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, NoCoalescing: true,
		WriteBackInterval: time.Hour, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	op := pol.Op(floodgate.OpAllow, "hot", 1, 0)
	admit := func(from, to int64) {
		for i := from; i <= to; i++ {
			if d, err := s.Do(ctx, wbT0+i*1000, op); err != nil || !d.Allowed {
				t.Fatalf("request %d: %+v, %v", i, d, err)
			}
		}
	}
	admit(0, 0)
	waitNodes(t, []*redisstore.Store{s}, 1)
	admit(1, 200) // 101 exact (the warm-up), 100 in memory
	if st := s.Stats(); st.WriteBackLocal != 100 || st.WriteBackSyncs != 0 {
		t.Fatalf("%d decisions in memory, %d syncs; want 100, 0", st.WriteBackLocal, st.WriteBackSyncs)
	}
	now := wbT0 + 200_000
	peek := func(cost int64) floodgate.Decision {
		t.Helper()
		d, err := s.Do(ctx, now, pol.Op(floodgate.OpPeek, "hot", cost, 0))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := peek(0); !d.Allowed || d.Remaining != limit-201 {
		t.Errorf("Peek: %+v; want admitted, %d remaining (201 admitted)", d, limit-201)
	}
	admit(201, 250) // 50 more in memory
	if d := peek(800); d.Allowed || d.Remaining != limit-251 || d.Reason != floodgate.ReasonLimited {
		t.Errorf("PeekN(800) after 251 admitted: %+v; want refused, %d remaining", d, limit-251)
	}
	if d := peek(749); !d.Allowed {
		t.Errorf("PeekN(749) after 251 admitted: %+v; want admitted", d)
	}
	admit(251, 260)
	out := make([]floodgate.Decision, 2)
	other := pol.Op(floodgate.OpPeek, "cold", 1, 0)
	if err := s.DoBatch(ctx, now, []floodgate.Op{pol.Op(floodgate.OpPeek, "hot", 0, 0), other}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Remaining != limit-261 || out[1].Remaining != limit {
		t.Errorf("a batch's peeks: %+v; want %d and %d remaining", out, limit-261, limit)
	}
	v, err := s.WriteBackCall(pol, "hot", now, 0, 0, 0)
	if err != nil || v[5] != 261 {
		t.Errorf("Redis's count %v (%v), want 261: peeks consume nothing", v, err)
	}
}
