package redistest

import "testing"

// StandaloneDurable starts one Redis server that keeps its data across
// Server.Restart: an append-only file written and fsynced at every write
// (appendfsync always), so a SIGKILL loses nothing Redis has answered.
// What a test of a crash and a restart uses when the data Redis forgets
// is not its subject.
func StandaloneDurable(t testing.TB) *Server {
	t.Helper()
	Require(t)
	return start(t, t.TempDir(), "--appendonly", "yes", "--appendfsync", "always")
}
