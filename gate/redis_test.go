package gate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// Two gates (two servers of a fleet) on one Redis enforce one limit, and
// a ban set through one holds on the other, on the same engine as memory.
func TestRedisFleetAndBan(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	clk := clock.NewManual(t0)
	limits := []Limit{
		{Name: "per-ip", Policy: policy(t, "per-ip", floodgate.Rule{Algorithm: floodgate.SlidingWindow, Limit: 40, Period: time.Minute}), Key: []Part{IP()}, Match: Match{PathPrefix: "/a"}},
		{Name: "ban", Policy: policy(t, "ban", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1000, Period: 20 * time.Minute}), Key: []Part{IP()}, Match: Match{PathPrefix: "/b"},
			Action: Ban, Ban: BanRule{Threshold: 20, Interval: 20 * time.Minute, Duration: time.Hour}},
	}
	var gates []*Gate
	for i := 0; i < 2; i++ {
		st, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		g, err := New(Config{Limits: limits, Store: st, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		gates = append(gates, g)
	}
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				v := new(Verdict)
				gates[(w+i)%2].Check(httpReq("192.0.2.1:1", "/a"), v)
				if v.Err != nil {
					t.Error(v.Err)
				}
				if v.Allowed {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if allowed != 40 {
		t.Fatalf("fleet admitted %d, want 40", allowed)
	}

	for i := 0; i < 21; i++ {
		v := check(gates[i%2], httpReq("192.0.2.1:1", "/b"))
		if v.Allowed != (i < 20) {
			t.Fatalf("request %d: allowed %v", i, v.Allowed)
		}
	}
	clk.Set(t0.Add(80*time.Minute - 20*time.Millisecond))
	if v := check(gates[1], httpReq("192.0.2.1:1", "/b")); v.Allowed || !v.Outcomes[0].Banned {
		t.Fatal("the ban did not hold on the other server until the end of the interval plus its duration")
	}
	clk.Set(t0.Add(80*time.Minute + 20*time.Millisecond))
	if v := check(gates[0], httpReq("192.0.2.1:1", "/b")); !v.Allowed {
		t.Fatalf("ban outlived its time: %+v", v.Deciding.Decision)
	}
	for i := 0; i < 21; i++ {
		check(gates[0], httpReq("192.0.2.2:1", "/b"))
	}
	if err := gates[1].Lift(context.Background(), "ban", "192.0.2.2"); err != nil {
		t.Fatal(err)
	}
	if v := check(gates[0], httpReq("192.0.2.2:1", "/b")); !v.Allowed {
		t.Fatal("lifted on one server, still banned on the other")
	}
}
