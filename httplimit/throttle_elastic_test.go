package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/throttle"
)

// TestThrottledElasticFollowsLoad: a rules file's elastic limit (2 a
// minute per client, up to 4 while spare) fed by the throttler's signal
// (rules.Options.Spare = th.Spare(0.5), 4 slots): while the server is
// idle a client gets 4 through; while 2 requests are held in the
// handler (3 in flight with the one decided, past half the limit) the
// next client gets only its 2; once they finish, a third client gets 4
// again. The gate's clock is manual: no window rolls meanwhile.
func TestThrottledElasticFollowsLoad(t *testing.T) {
	th := throttle.New(throttle.Config{Limit: 4})
	d, err := rules.ParseWith("e.yaml", []byte(`domain: e
http:
  - name: api
    key: [remote_address]
    rate_limit: {unit: minute, requests_per_unit: 2, mode: elastic, elastic_ceiling: 4}
`), rules.Options{Spare: th.Spare(0.5)})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	limits, err := gate.FromRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Rules: cfg, Limits: limits, Clock: clock.NewManual(time.Unix(1_800_000_000, 0))}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	release, started := make(chan struct{}), make(chan struct{}, 4)
	h := mw.Throttled(th, throttle.MiddlewareOptions{})(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			started <- struct{}{}
			<-release
		}
	}))
	send := func(ip, path string) int {
		req := httptest.NewRequest("GET", path, nil)
		req.RemoteAddr = ip + ":1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	passed := func(ip string) int {
		n := 0
		for range 6 {
			if send(ip, "/x") == 200 {
				n++
			}
		}
		return n
	}
	if n := passed("192.0.2.1"); n != 4 {
		t.Errorf("idle server: %d of 6 passed, want 4 (the elastic ceiling)", n)
	}
	var wg sync.WaitGroup
	for _, ip := range []string{"192.0.2.10", "192.0.2.11"} {
		wg.Go(func() { send(ip, "/held") })
		<-started
	}
	if n := passed("192.0.2.2"); n != 2 {
		t.Errorf("busy server (2 held of 4 slots): %d of 6 passed, want 2 (the limit)", n)
	}
	close(release)
	wg.Wait()
	if n := passed("192.0.2.3"); n != 4 {
		t.Errorf("idle again: %d of 6 passed, want 4", n)
	}
}
