package service

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLazyTimeout(t *testing.T) {
	// The caller's earlier deadline wins: no wrapper.
	parent, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if got := withLazyTimeout(parent, time.Hour); got != parent {
		t.Fatal("a context with an earlier deadline must be used as it is")
	}

	// Expires at its deadline, as context.WithTimeout.
	ctx := withLazyTimeout(context.Background(), 20*time.Millisecond)
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > 20*time.Millisecond {
		t.Fatalf("deadline %v %v", dl, ok)
	}
	if ctx.Err() != nil {
		t.Fatal("expired early")
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("never expired")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err %v", ctx.Err())
	}
	ctx.(*lazyTimeout).stop()

	// Err past the deadline without anyone waiting on Done.
	ctx = withLazyTimeout(context.Background(), time.Millisecond)
	time.Sleep(3 * time.Millisecond)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err %v", ctx.Err())
	}
	ctx.(*lazyTimeout).stop()

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
	ctx.(*lazyTimeout).stop()

	// Stopped before anyone waited: cancelled from then on.
	ctx = withLazyTimeout(context.Background(), time.Hour)
	ctx.(*lazyTimeout).stop()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("after stop: %v", ctx.Err())
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatal("after stop, Done must be closed")
	}
}
