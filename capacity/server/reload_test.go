package server

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

const resourcesV1 = `resources:
  - id: db
    capacity: 100
    algorithm: fair_share
    lease_length: 10s
    refresh_interval: 1s
  - id: "*"
    capacity: 1
`

// TestReload: a good file goes live whole; a bad one is refused with its
// file:line, and the resources live before stay live.
func TestReload(t *testing.T) {
	file := filepath.Join(t.TempDir(), "resources.yaml")
	if err := os.WriteFile(file, []byte(resourcesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(t0)
	var reloaded []*lease.Config
	s, err := Open(file, Options{Clock: clk, OnReload: func(c *lease.Config) { reloaded = append(reloaded, c) }})
	if err != nil {
		t.Fatal(err)
	}
	c := serveGRPC(t, s)
	a := newClient("a", c)
	if g := a.get(t, "db", 500); g != 100 {
		t.Fatalf("got %v, want 100", g)
	}
	// A bad file: capacity 200 on a good line, then an error further down.
	bad := strings.Replace(resourcesV1, "capacity: 100", "capacity: 200", 1)
	bad = strings.Replace(bad, "refresh_interval: 1s", "refresh_interval: 20s", 1)
	os.WriteFile(file, []byte(bad), 0o644)
	err = s.Reload()
	if err == nil || !strings.Contains(err.Error(), file+":6:") {
		t.Fatalf("Reload of a bad file: %v, want an error at %s:6", err, file)
	}
	clk.Advance(2 * time.Second)
	if g := a.get(t, "db", 500); g != 100 {
		t.Fatalf("after a refused reload got %v, want the old capacity 100", g)
	}
	if len(reloaded) != 0 {
		t.Fatal("OnReload called for a refused file")
	}
	os.WriteFile(file, []byte(strings.Replace(resourcesV1, "capacity: 100", "capacity: 200", 1)), 0o644)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if len(reloaded) != 1 || s.Config().Find("db").Capacity != 200 {
		t.Fatalf("reload not live: %v", reloaded)
	}
	clk.Advance(time.Second)
	if g := a.get(t, "db", 500); g != 200 {
		t.Fatalf("after reload got %v, want 200", g)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.yaml"), Options{}); err == nil {
		t.Fatal("Open of a missing file succeeded")
	}
}

// TestConcurrentNeverOverGrants: many clients asking at once over gRPC,
// with demand shifting and the clock moving, while a sampler checks the
// table's outstanding capacity, never above the capacity (-race).
func TestConcurrentNeverOverGrants(t *testing.T) {
	s, c, clk := newTest(t, config(resource("db", 100, lease.FairShare)), Options{})
	stop := make(chan struct{})
	var wg, sampler sync.WaitGroup
	var worst float64
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			worst = max(worst, s.Outstanding("db"))
			time.Sleep(100 * time.Microsecond)
		}
	})
	for w := range 8 {
		wg.Go(func() {
			cl := newClient("c"+string(rune('a'+w)), c)
			for i := range 200 {
				cl.get(t, "db", float64((w*7+i)%40))
				if i%50 == 0 {
					clk.Advance(300 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	if worst > 100+eps {
		t.Fatalf("outstanding reached %v > 100", worst)
	}
}
