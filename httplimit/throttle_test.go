package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/throttle"
)

// A quota refusal is 429 and gives its throttler slot back at once
// (no completion counted); overload is 503, also for a request over its
// quota (the throttler is asked first: a shed request spends no quota).
func TestThrottledQuota429Overload503(t *testing.T) {
	perIP := floodgate.MustPolicy("per-ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Minute})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{
		Limits: []gate.Limit{{Name: "per-ip", Policy: perIP, Key: []gate.Part{gate.IP()}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	th := throttle.New(throttle.Config{Limit: 1}) // no queue
	release, started := make(chan struct{}), make(chan struct{}, 1)
	h := mw.Throttled(th, throttle.MiddlewareOptions{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
	}))
	send := func(ip string) int {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = ip + ":1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	var wg sync.WaitGroup
	wg.Go(func() { send("192.0.2.1") })
	<-started
	if c := send("192.0.2.1"); c != 503 {
		t.Errorf("over quota, server full: %d, want 503", c)
	}
	if c := send("192.0.2.2"); c != 503 {
		t.Errorf("within quota, server full: %d, want 503", c)
	}
	close(release)
	wg.Wait()
	if c := send("192.0.2.1"); c != 429 {
		t.Errorf("over quota, server idle: %d, want 429", c)
	}
	if st := th.Stats(); st.InFlight != 0 || st.Completions != 1 || st.Admitted != 2 {
		t.Errorf("after a quota refusal: %+v; want nothing in flight, 2 admitted, 1 completion (the refusal released, not completed)", st)
	}
	if c := send("192.0.2.3"); c != 200 {
		t.Errorf("after the load: %d", c)
	}
}
