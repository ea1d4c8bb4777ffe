package elect

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/etcdtest"
)

type view struct {
	mu       sync.Mutex
	isMaster bool
	master   string
}

func (v *view) get() (bool, string) { v.mu.Lock(); defer v.mu.Unlock(); return v.isMaster, v.master }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 15s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOneMasterAndHandover: three replicas on a real etcd elect exactly
// one master, all name it, and when it closes (resigns) another takes over
// and everyone names the new one. A sampler checks throughout that no two
// replicas ever say they are master at once.
func TestOneMasterAndHandover(t *testing.T) {
	etcd := etcdtest.Start(t)
	const n = 3
	views := make([]*view, n)
	els := make([]*Elector, n)
	var both atomic.Int64
	for i := range n {
		v := &view{}
		views[i] = v
		e, err := Start(Options{Endpoints: []string{etcd.ClientURL}, Address: fmt.Sprintf("replica-%d", i), TTL: 2,
			OnChange: func(m bool, addr string) { v.mu.Lock(); v.isMaster, v.master = m, addr; v.mu.Unlock() }})
		if err != nil {
			t.Fatal(err)
		}
		els[i] = e
	}
	closed := make([]atomic.Bool, n)
	defer func() {
		for i, e := range els {
			if !closed[i].Load() {
				e.Close()
			}
		}
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			masters := 0
			for _, e := range els {
				if m, _ := e.State(); m {
					masters++
				}
			}
			if masters > 1 {
				both.Add(1)
			}
		}
	})
	agreed := func(skip int) (string, int) {
		first, who := "", -1
		for i, v := range views {
			if i == skip {
				continue
			}
			m, addr := v.get()
			if addr == "" || (first != "" && addr != first) {
				return "", -1
			}
			first = addr
			if m {
				who = i
			}
		}
		return first, who
	}
	var leader int
	waitFor(t, "agreed master", func() bool { _, w := agreed(-1); leader = w; return w >= 0 })
	addr, _ := agreed(-1)
	if addr != fmt.Sprintf("replica-%d", leader) {
		t.Fatalf("everyone names %q, but replica %d is master", addr, leader)
	}
	closed[leader].Store(true)
	els[leader].Close()
	waitFor(t, "new master after resign", func() bool { a, w := agreed(leader); return w >= 0 && a != addr })
	close(stop)
	wg.Wait()
	if both.Load() > 0 {
		t.Fatalf("two masters at once in %d samples", both.Load())
	}
}

// TestStepsDownWhenEtcdGoes: a master whose etcd dies stops being master
// (its session ends) instead of staying master blind.
func TestStepsDownWhenEtcdGoes(t *testing.T) {
	etcd := etcdtest.Start(t)
	v := &view{}
	e, err := Start(Options{Endpoints: []string{etcd.ClientURL}, Address: "a", TTL: 1,
		OnChange: func(m bool, addr string) { v.mu.Lock(); v.isMaster, v.master = m, addr; v.mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitFor(t, "master", func() bool { m, _ := v.get(); return m })
	etcd.Kill()
	waitFor(t, "step down", func() bool { m, _ := v.get(); return !m })
}
