package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

func TestManualSleepWakesOnAdvance(t *testing.T) {
	m := clock.NewManual(time.Unix(1000, 0))
	done := make(chan error, 1)
	go func() { done <- m.Sleep(context.Background(), 2*time.Second) }()
	if err := m.WaitForSleepers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	m.Advance(time.Second)
	select {
	case <-done:
		t.Fatal("woke after 1s of a 2s sleep")
	default:
	}
	if m.Sleepers() != 1 {
		t.Fatal("sleeper vanished")
	}
	m.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := m.NowMicro(); got != 1002*1e6 {
		t.Fatalf("now = %d", got)
	}
}

func TestManualSleepCancelled(t *testing.T) {
	m := clock.NewManual(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Sleep(ctx, time.Hour) }()
	m.WaitForSleepers(context.Background(), 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if m.Sleepers() != 0 {
		t.Fatal("cancelled sleeper still registered")
	}
	if err := m.Sleep(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
}

func TestManualSetBackwards(t *testing.T) {
	m := clock.NewManual(time.Unix(100, 0))
	m.Set(time.Unix(50, 0))
	if !m.Now().Equal(time.Unix(50, 0)) {
		t.Fatal("Set did not move the clock back")
	}
}

// The coarse clock stays within a few resolutions of the system clock and
// never runs backwards while it is read.
func TestCoarseTracksSystemClock(t *testing.T) {
	prev := clock.Coarse.NowMicro()
	for range 2000 {
		now := clock.Coarse.NowMicro()
		if now < prev {
			t.Fatalf("coarse clock went back: %d after %d", now, prev)
		}
		prev = now
		sys := time.Now().UnixMicro()
		// Generous bound: a descheduled ticker on a busy CI machine lags.
		if lag := sys - now; lag < -1000 || lag > 250_000 {
			t.Fatalf("coarse clock is %dµs off the system clock", lag)
		}
	}
	if d := clock.Precise.NowMicro() - time.Now().UnixMicro(); d > 1000 || d < -1000 {
		t.Fatalf("precise clock off by %dµs", d)
	}
}
