package memstore_test

import (
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/storetest"
)

// TestConformance runs the store conformance suite against the in-memory
// store.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) floodgate.Store {
		// No background sweep: it reads the wall clock, and the suite's
		// clock is years behind it, so a sweep would drop keys that are
		// not fresh by the suite's clock.
		s, err := memstore.New(memstore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
		return s
	})
}
