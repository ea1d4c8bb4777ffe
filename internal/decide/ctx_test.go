package decide

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLazyTimeout(t *testing.T) {
	// A caller's deadline before the timeout: half-way to it, so that
	// what comes after the lookup has the other half.
	parent, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pdl, _ := parent.Deadline()
	before := time.Now()
	early := withLazyTimeout(parent, time.Hour)
	dl, ok := early.Deadline()
	if half := before.Add(pdl.Sub(before) / 2); !ok || dl.Before(half) || dl.After(half.Add(time.Since(before))) {
		t.Fatalf("deadline %v, want half-way (%v) to the parent's %v", dl, half, pdl)
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
	// (Judged by the deadline it takes and by polling Err, not by a sleep:
	// on a starved host the timer's callback may run late.)
	ctx = withLazyTimeout(context.Background(), time.Millisecond)
	time.Sleep(3 * time.Millisecond)
	first := time.Now()
	ctx.Err() // the first use: the timeout runs from here
	if dl, _ := ctx.Deadline(); dl.Before(first.Add(time.Millisecond)) {
		t.Fatalf("deadline %v runs from before the first use (%v)", dl, first)
	}
	for giveUp := time.Now().Add(5 * time.Second); ctx.Err() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(giveUp) {
			t.Fatal("Err still nil 5 s past the deadline")
		}
	}
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
