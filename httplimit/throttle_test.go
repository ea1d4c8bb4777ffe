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

// Quota refusals stay 429 and never touch the throttler; overload is 503.
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
	if c := send("192.0.2.1"); c != 429 {
		t.Errorf("over quota: %d, want 429", c)
	}
	if st := th.Stats(); st.Refused != [4]uint64{} {
		t.Errorf("a quota refusal reached the throttler: %+v", st.Refused)
	}
	if c := send("192.0.2.2"); c != 503 {
		t.Errorf("within quota, server full: %d, want 503", c)
	}
	close(release)
	wg.Wait()
	if c := send("192.0.2.3"); c != 200 {
		t.Errorf("after the load: %d", c)
	}
}
