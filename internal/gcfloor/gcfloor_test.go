package gcfloor

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestSet(t *testing.T) {
	if _, set := os.LookupEnv("GOGC"); set {
		t.Skip("GOGC is set: Set leaves it alone")
	}
	gogc := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	Set(128 << 20)
	deadline := time.Now().Add(5 * time.Second)
	for gogc() <= 100 {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC stays %d with a 128 MiB floor and a small heap", gogc())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	// The floor follows the live heap after each collection: a heap beyond
	// half the floor gets the default.
	big := make([]*[1 << 20]byte, 80) // 80 MiB live, over half the floor
	for i := range big {
		big[i] = new([1 << 20]byte)
	}
	for gogc() != 100 {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("GOGC %d with a live heap beyond half the floor, want 100", gogc())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(big)
}
