// Package gcfloor tunes the garbage collector of a whole process: the
// floodgate command's, not a library's.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Default is the heap size below which `floodgate serve` does not
// collect garbage.
const Default = 64 << 20

var gcFloorOnce sync.Once

// Set keeps the garbage collector from running before the heap
// reaches floor bytes, for a process whose live heap is small: the service
// (and gRPC under it) allocates a few kilobytes per request, and with a live
// heap of a few megabytes Go's default (GOGC=100: collect when the heap has
// doubled) collects dozens of times a second under load. Each collection
// costs CPU and shrinks idle goroutines' stacks, which the next request
// grows again. Once the live heap is beyond floor/2 the default applies
// unchanged: the floor costs memory (up to floor bytes of garbage before a
// collection), never more than that.
//
// After every collection it sets GOGC to max(100, what brings the next one
// at floor). It does nothing when the GOGC environment variable is set: the
// operator decides. Only the first call counts.
func Set(floor uint64) {
	if _, set := os.LookupEnv("GOGC"); set || floor == 0 {
		return
	}
	gcFloorOnce.Do(func() {
		t := &gcTuner{floor: floor, samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
		t.adjust()
		t.arm()
	})
}

type gcTuner struct {
	floor   uint64
	samples []metrics.Sample
	percent int
}

// sentinel is garbage whose finalizer runs after each collection. It holds
// a pointer so the tiny allocator (whose blocks may outlive a cycle) never
// takes it.
type sentinel struct {
	t *gcTuner
	_ [2]uint64
}

func (t *gcTuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) {
		s.t.adjust()
		s.t.arm()
	})
}

func (t *gcTuner) adjust() {
	metrics.Read(t.samples)
	live := uint64(0)
	if t.samples[0].Value.Kind() == metrics.KindUint64 {
		live = t.samples[0].Value.Uint64()
	}
	p := 100 // also before the first collection, which measures the live heap
	if live > 0 && live < t.floor/2 {
		p = int((t.floor - live) * 100 / live)
	}
	if p != t.percent {
		t.percent = p
		debug.SetGCPercent(p)
	}
}
