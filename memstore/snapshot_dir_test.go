package memstore

import (
	"path/filepath"
	"strings"
	"testing"
)

// A snapshot path whose directory cannot be written is refused by New,
// not found out at Close, when the state it was to keep is lost.
func TestSnapshotDirMustBeWritable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir", "state.snap")
	if s, err := New(Options{SnapshotPath: missing}); err == nil || !strings.Contains(err.Error(), "cannot be written") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("New with a snapshot in a missing directory: %v", err)
	}
	s, err := New(Options{SnapshotPath: filepath.Join(t.TempDir(), "state.snap")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
