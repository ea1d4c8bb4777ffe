package inflight_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/floodgate/floodgate/inflight"
	"github.com/floodgate/floodgate/inflight/inflighttest"
)

func newMemory(t *testing.T, limit int) inflight.Limiter {
	m, err := inflight.NewMemory(inflight.MemoryOptions{Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMemoryConformance(t *testing.T) { inflighttest.Run(t, newMemory) }

// A flood of distinct keys: the table never holds more than MaxKeys, new
// keys past it are refused (not admitted untracked), and it empties when
// the slots are released.
func TestMemoryBoundedKeys(t *testing.T) {
	m, err := inflight.NewMemory(inflight.MemoryOptions{Limit: 2, MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	var toks []*inflight.Token
	for i := range 1000 {
		tok, ok, err := m.Acquire(context.Background(), fmt.Sprint("k", i))
		switch {
		case i < 100 && (!ok || err != nil):
			t.Fatalf("key %d refused: %v", i, err)
		case i >= 100 && (ok || !errors.Is(err, inflight.ErrTableFull) || !inflight.IsTableFull(err)):
			t.Fatalf("key %d past MaxKeys: ok=%v err=%v; want ErrTableFull", i, ok, err)
		}
		if ok {
			toks = append(toks, tok)
		}
	}
	if m.Keys() != 100 {
		t.Fatalf("Keys() = %d, want 100", m.Keys())
	}
	// a key already in the table still gets its second slot
	extra := inflighttest.MustAcquire(t, m, "k5")
	if m.InFlight("k5") != 2 {
		t.Fatalf("InFlight(k5) = %d", m.InFlight("k5"))
	}
	extra.Release()
	for _, tok := range toks {
		tok.Release()
		tok.Release()
	}
	if m.Keys() != 0 || m.InFlight("k5") != 0 {
		t.Fatalf("after release: %d keys, k5 holds %d; want an empty table", m.Keys(), m.InFlight("k5"))
	}
	inflighttest.MustAcquire(t, m, "new").Release()
}

func TestMemoryOptionsErrors(t *testing.T) {
	for _, o := range []inflight.MemoryOptions{{Limit: 0}, {Limit: -1}, {Limit: 1, MaxKeys: -1}} {
		if _, err := inflight.NewMemory(o); err == nil {
			t.Errorf("NewMemory(%+v) accepted", o)
		}
	}
}
