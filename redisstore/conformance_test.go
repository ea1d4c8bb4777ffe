package redisstore_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

var namespace atomic.Int64

// conform runs the engine's conformance suite against Redis at url, each
// subtest in a namespace (key prefix) of its own, with the near cache on
// (the default): it must answer as Redis would. A run in which the near
// cache answered nothing fails, as it would test nothing of it.
func conform(t *testing.T, url string, batch bool) {
	var near atomic.Int64
	defer func() {
		if !t.Failed() && near.Load() == 0 {
			t.Error("the near cache answered nothing in the whole suite")
		}
	}()
	storetest.Run(t, func(t *testing.T) floodgate.Store {
		s, err := redisstore.New(url, redisstore.Options{
			ClientTime: true, // the suite injects its clock
			Timeout:    5 * time.Second,
			Prefix:     fmt.Sprintf("conf%d", namespace.Add(1)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if batch {
			redisstore.SetBatchAlways(s)
		}
		t.Cleanup(func() {
			near.Add(s.Stats().NearHits)
			if st := s.Stats(); st.Errors != 0 {
				t.Errorf("store errors during the test: %+v", st)
			}
			s.Close()
		})
		return s
	})
}

func TestConformanceStandalone(t *testing.T) {
	conform(t, "redis://"+redistest.Standalone(t).Addr, false)
}

// Every decision through the batch function, as concurrent callers'
// decisions are sent.
func TestConformanceBatched(t *testing.T) {
	conform(t, "redis://"+redistest.Standalone(t).Addr, true)
}

func TestConformanceSentinel(t *testing.T) {
	set := redistest.Sentinel(t)
	conform(t, "redis-sentinel://"+set.Sentinel.Addr+"/"+set.Name, false)
}

func TestConformanceCluster(t *testing.T) {
	c := redistest.Cluster(t, 3)
	conform(t, "redis-cluster://"+strings.Join(c.Addrs(), ","), false)
}
