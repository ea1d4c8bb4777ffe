package redisstore

import (
	"testing"
	"time"
)

// A probe whose caller never reports (it left, or had no time to ask
// Redis) is given up after a cooldown, and the next call probes: before,
// the breaker stayed open for good, every decision by the failure modes.
func TestBreakerLostProbe(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := &breaker{threshold: 3, cooldown: time.Second, clock: func() time.Time { return now }}
	for range 3 {
		b.failure()
	}
	if b.allow() {
		t.Fatal("open breaker allowed a call before its cooldown")
	}
	now = now.Add(time.Second)
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow() {
		t.Fatal("a second probe while the first is in flight")
	}
	// The probe's caller never reports.
	now = now.Add(999 * time.Millisecond)
	if b.allow() {
		t.Fatal("a lost probe given up before a cooldown")
	}
	now = now.Add(time.Millisecond)
	if !b.allow() {
		t.Fatal("a lost probe holds the breaker open")
	}
	b.success()
	if !b.allow() || b.isOpen() {
		t.Fatal("a probe's success did not close the breaker")
	}
}
