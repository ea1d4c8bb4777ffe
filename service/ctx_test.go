package service

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLazyTimeout(t *testing.T) {
	// The caller's earlier deadline wins.
	parent, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	pdl, _ := parent.Deadline()
	early := withLazyTimeout(parent, time.Hour)
	if dl, ok := early.Deadline(); !ok || !dl.Equal(pdl) {
		t.Fatalf("deadline %v, want the parent's %v", dl, pdl)
	}
	early.stop()

	// Expires at its deadline, as context.WithTimeout.
	start := time.Now()
	ctx := withLazyTimeout(context.Background(), 20*time.Millisecond)
	if dl, ok := ctx.Deadline(); !ok || dl.Sub(start) > 20*time.Millisecond+time.Since(start) {
		t.Fatalf("deadline %v %v", dl, ok)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("never expired")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err %v", ctx.Err())
	}
	ctx.stop()

	// Err past the deadline without anyone waiting on Done; the timeout
	// runs from the first use.
	ctx = withLazyTimeout(context.Background(), time.Millisecond)
	time.Sleep(3 * time.Millisecond)
	ctx.Err() // the first use: the timeout runs from here
	time.Sleep(3 * time.Millisecond)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err %v", ctx.Err())
	}
	ctx.stop()

	// The parent's cancellation and values pass through.
	type key struct{}
	p, pcancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	ctx = withLazyTimeout(p, time.Hour)
	if ctx.Value(key{}) != "v" {
		t.Fatal("value lost")
	}
	done := ctx.Done()
	pcancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the parent's cancellation did not pass")
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("err %v", ctx.Err())
	}
	ctx.stop()

	// Stopped before anyone waited: cancelled from then on.
	ctx = withLazyTimeout(context.Background(), time.Hour)
	ctx.stop()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("after stop: %v", ctx.Err())
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatal("after stop, Done must be closed")
	}
}
