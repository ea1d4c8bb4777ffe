package redistest

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate/redisstore"
)

// StoreOn starts a standalone server and returns it with a store on it
// that gives Redis 2 s a call and decides at the caller's clock
// (ClientTime), closed when the test ends: what a test of the failure
// modes pauses (Server.Pause) to make every call time out. The timeout is
// not what those tests check, so it is generous: with the 50 ms of the
// default a starved CI host saw decisions degraded while Redis was up.
func StoreOn(t testing.TB) (*Server, *redisstore.Store) {
	t.Helper()
	srv := Standalone(t)
	st, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 2 * time.Second, ClientTime: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return srv, st
}
