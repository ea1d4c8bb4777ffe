package lease

import (
	"errors"
	"testing"
)

// FuzzParseConfig: any input gives either a valid Config or errors that
// are all *Error naming the file, never a panic; a valid Config keeps the
// rules (the "*" default last, refresh < lease <= learning, amounts in range).
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte("resources:\n  - id: \"*\"\n    capacity: 1\n"))
	f.Add([]byte("resources:\n  - id: a\n    capacity: -1\n    algoritm: x\n"))
	f.Add([]byte("a: &a [*a]\nresources: *a\n"))
	f.Add([]byte("resources:\n  - <<: [{id: '*'}, {capacity: 5}]\n    lease_length: 1s\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig("f.yaml", data)
		if err != nil {
			if cfg != nil {
				t.Fatal("a config beside an error")
			}
			var joined interface{ Unwrap() []error }
			errs := []error{err}
			if errors.As(err, &joined) {
				errs = joined.Unwrap()
			}
			for _, e := range errs {
				var pe *Error
				if !errors.As(e, &pe) || pe.File != "f.yaml" {
					t.Fatalf("not an *Error naming the file: %v", e)
				}
			}
			return
		}
		n := len(cfg.Resources)
		if n == 0 || cfg.Resources[n-1].ID != "*" {
			t.Fatalf("no \"*\" default last: %+v", cfg.Resources)
		}
		for _, r := range cfg.Resources {
			if !(r.RefreshInterval > 0 && r.RefreshInterval < r.LeaseLength && r.LeaseLength <= r.LearningMode) ||
				!(r.Capacity >= 0 && r.Capacity <= MaxCapacity) || r.SafeCapacity > r.Capacity {
				t.Fatalf("an invalid resource accepted: %+v", r)
			}
		}
	})
}
