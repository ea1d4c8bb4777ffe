package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// Redis loses the function library (a restart without its data; here
// FUNCTION FLUSH) while a write-back key is hot: the store loads the
// library again and sends its pipeline again, and goes on deciding on
// Redis. Before, write-back sent again the commands rueidis had recycled
// after the first send, and the process panicked ("a command should be
// finished by calling Build()"): cmd/floodgate's TestWriteBackRedisKilled
// found it.
func TestWriteBackLibraryLost(t *testing.T) {
	srv := redistest.Standalone(t)
	pol := wbPolicy(t, floodgate.FixedWindow, 1000, 0.05, floodgate.FailClosed)
	s := wbNode(t, srv, "lost", pol, wbT0)
	waitNodes(t, []*redisstore.Store{s}, 1)
	ctx := context.Background()
	op := pol.Op(floodgate.OpAllow, "hot", 1, 0)
	decide := func(from int64) {
		t.Helper()
		for ms := range int64(300) { // one a millisecond: hot
			if _, err := s.Do(ctx, from+ms*1000, op); err != nil {
				t.Fatal(err)
			}
		}
	}
	decide(wbT0)
	if s.Stats().WriteBackLocal == 0 {
		t.Fatal("the key never went hot: nothing decided in memory")
	}
	if out, err := redistest.Cmd(srv.Addr, "FUNCTION", "FLUSH"); err != nil || out != "OK" {
		t.Fatalf("FUNCTION FLUSH: %s %v", out, err)
	}
	decide(wbT0 + 300_000)
	// the flusher's syncs (and any exact call) meet the missing library:
	// the store loads it again
	redistest.WaitFor(t, 5*time.Second, "the library loaded again", func() bool {
		out, _ := redistest.Cmd(srv.Addr, "FUNCTION", "LIST")
		return strings.Contains(out, "floodgate")
	})
	decide(wbT0 + 600_000)
	if st := s.Stats(); st.Degraded != 0 {
		t.Errorf("after the library was lost: %d decisions by the failure mode, want none", st.Degraded)
	}
}
