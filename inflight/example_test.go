package inflight_test

import (
	"context"
	"fmt"

	"github.com/floodgate/floodgate/inflight"
)

func ExampleMemory() {
	l, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: 2})
	a, _, _ := l.Acquire(context.Background(), "tenant-1")
	b, _, _ := l.Acquire(context.Background(), "tenant-1")
	_, ok, _ := l.Acquire(context.Background(), "tenant-1")
	fmt.Println("third in flight:", ok)
	a.Release()
	a.Release() // idempotent: b still holds its slot
	_, ok, _ = l.Acquire(context.Background(), "tenant-1")
	fmt.Println("after a release:", ok)
	b.Release()
	// Output:
	// third in flight: false
	// after a release: true
}
