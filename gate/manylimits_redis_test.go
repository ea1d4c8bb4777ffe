package gate

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// On Redis, a deny limit and a ban limit on one request are all or
// nothing: when the ban's limit refuses, the deny limit keeps what it had.
// (The ban's two operations sat between the group's members, and a Redis
// batch takes members side by side as one group: it decided the two
// apart, and the deny limit's hit was never given back.) And a request
// matching more limits than one call takes is decided whole there too.
func TestRedisGroupsAreWhole(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	clk := clock.NewManual(t0)
	st, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })

	t.Run("deny-and-ban", func(t *testing.T) {
		pa := policy(t, "deny", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1000, Period: time.Hour})
		pb := policy(t, "ban", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Hour})
		g, err := New(Config{Store: st, Clock: clk, Limits: []Limit{
			{Name: "deny", Policy: pa, Key: []Part{IP()}},
			{Name: "ban", Policy: pb, Key: []Part{IP()}, Action: Ban, Ban: BanRule{Threshold: 100, Interval: time.Hour, Duration: time.Hour}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if v := check(g, httpReq("192.0.2.1:1", "/")); v.Allowed != (i == 0) || v.Err != nil {
				t.Fatalf("request %d: allowed %v, %v", i, v.Allowed, v.Err)
			}
		}
		if got := remaining(t, st, pa, "192.0.2.1"); got != 999 {
			t.Errorf("the deny limit has %d left, want 999: the refused requests took from it", got)
		}
	})

	t.Run("over-one-call", func(t *testing.T) {
		const n = 40
		limits, ps := manyLimits(t, n, 16, func(i int) int64 {
			if i == n-1 {
				return 1
			}
			return 100
		})
		for i := range limits {
			limits[i].Name, limits[i].Policy = "redis-"+limits[i].Name, policy(t, fmt.Sprintf("redis-p%d", i), ps[i].Rules()[0])
			ps[i] = limits[i].Policy
		}
		g, err := New(Config{Store: st, Clock: clk, Limits: limits, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if v := check(g, httpReq("192.0.2.1:1", "/")); v.Allowed != (i == 0) || v.Err != nil || len(v.Outcomes) != n {
				t.Fatalf("request %d: allowed %v, %d outcomes, %v", i, v.Allowed, len(v.Outcomes), v.Err)
			}
		}
		for i, p := range ps {
			want := int64(99)
			if i == n-1 {
				want = 0
			}
			if got := remaining(t, st, p, "192.0.2.1"); got != want {
				t.Errorf("%s: %d left, want %d", limits[i].Name, got, want)
			}
		}
	})
}
