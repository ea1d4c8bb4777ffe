package httplimit_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// With Redis killed under it, the middleware answers every request within
// the store's deadline by each rule's failure mode, and never leaks or
// panics; with Redis back, it limits again.
func TestRedisDownFailureModes(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	// Generous: the counts with Redis up must be Redis's on a starved CI
	// host too (with 50 ms one timed out there, and the open rule admitted
	// it); a killed Redis refuses connections, so answers come well
	// within it.
	const storeTimeout = 2 * time.Second
	// The near cache off: with it, the key Redis refused before it died
	// stays refused until the time Redis gave (docs/REDIS.md, "The near
	// cache"), and this test's subject is the failure modes.
	st, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: storeTimeout, NoNearCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	open := mustPolicy(t, "open", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 2, Period: time.Hour, OnStoreFailure: floodgate.FailOpen})
	closed := mustPolicy(t, "closed", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 100, Period: time.Hour, OnStoreFailure: floodgate.FailClosed})
	srvOpen, servedOpen := serve(t, httplimit.Options{Config: gate.Config{Store: st, Limits: []gate.Limit{{Name: "open", Policy: open, Key: []gate.Part{gate.IP()}}}}})
	srvClosed, _ := serve(t, httplimit.Options{Config: gate.Config{Store: st, Limits: []gate.Limit{{Name: "closed", Policy: closed, Key: []gate.Part{gate.IP()}}}}})

	status := func(url string) (int, time.Duration) {
		start := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	for i := 0; i < 3; i++ {
		status(srvOpen.URL)
	}
	if servedOpen.Load() != 2 {
		t.Fatalf("with Redis up: served %d, want 2", servedOpen.Load())
	}
	srv.Kill()
	for i := 0; i < 20; i++ {
		code, took := status(srvOpen.URL)
		if code != 200 || took > storeTimeout {
			t.Fatalf("fail-open rule, Redis down: %d after %v", code, took)
		}
		code, took = status(srvClosed.URL) // refused for the store, not a limit
		if code != 503 || took > storeTimeout {
			t.Fatalf("fail-closed rule, Redis down: %d after %v", code, took)
		}
	}
	srv.Restart(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Back on Redis (restarted empty): the count starts afresh and
		// the third request is refused.
		if code, _ := status(srvOpen.URL); code == 429 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still not limiting 20 s after Redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
