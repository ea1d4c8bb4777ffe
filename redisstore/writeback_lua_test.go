package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// WriteBackFunction adds hits to the window they were admitted in: the
// current one, the one before (kept for a fixed window, the previous count
// of a sliding window counter), or none when it is gone (-1); and decides a
// cost exactly on top.
func TestWriteBackFunctionWindows(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const T = int64(1_800_000_000) * 1_000_000
	const P = int64(time.Second / time.Microsecond)
	for _, tc := range []struct {
		algo  floodgate.Algorithm
		steps [][2][]int64 // {now, tag, hits, cost}, want {allowed, before, after, window, prev, cur}
	}{
		{floodgate.FixedWindow, [][2][]int64{
			{{T, 0, 0, 10}, {0, -1, -1, T, 0, 0}},            // too large: nothing
			{{T, 0, 0, 6}, {1, -1, -1, T, 0, 6}},             // exact: admitted
			{{T, T, 3, 2}, {0, 6, 9, T, 0, 9}},               // 3 hits, then 2 do not fit
			{{T + P, 0, 0, 1}, {1, -1, -1, T + P, 0, 1}},     // the next window
			{{T + P, T, 2, 0}, {0, 9, 11, T + P, 0, 1}},      // late hits: the window before's count
			{{T + 2*P, T, 1, 0}, {0, 11, 12, T + 2*P, 0, 0}}, // still the window before in Redis: measured
			{{T + 3*P, 0, 0, 1}, {1, -1, -1, T + 3*P, 0, 1}},
			{{T + 3*P, T, 1, 0}, {0, -1, -1, T + 3*P, 0, 1}}, // two windows on: gone
		}},
		{floodgate.SlidingWindow, [][2][]int64{
			{{T, T, 4, 0}, {0, 0, 4, T, 0, 4}},
			{{T + P, T, 2, 0}, {0, 4, 6, T + P, 6, 0}}, // late hits: the previous count
			{{T + P, T + P, 1, 0}, {0, 0, 1, T + P, 6, 1}},
			{{T + 3*P, 0, 0, 1}, {1, -1, -1, T + 3*P, 0, 1}},
			{{T + 3*P, T, 1, 0}, {0, -1, -1, T + 3*P, 0, 1}}, // gone
		}},
	} {
		t.Run(string(tc.algo), func(t *testing.T) {
			pol, err := floodgate.NewPolicy("fn"+string(tc.algo), floodgate.Rule{Name: "r", Algorithm: tc.algo, Limit: 9,
				Period: time.Second, Tier: floodgate.TierWriteBack, Budget: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				in, want := st[0], st[1]
				v, err := s.WriteBackCall(pol, "k", in[0], in[1], in[2], in[3])
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if !slices.Equal(v[:6], want) {
					t.Errorf("step %d %v: got %v, want %v", i, in, v[:6], want)
				}
			}
			// the exact decision reads what write-back wrote (a fixed
			// window's state carries the window before's count along)
			d, err := s.Do(context.Background(), T+3*P, pol.Op(floodgate.OpAllow, "k", 1, 0))
			if err != nil || !d.Allowed || d.Remaining != 7 {
				t.Errorf("an exact decision after: %+v, %v; want admitted, 7 remaining", d, err)
			}
		})
	}
}
