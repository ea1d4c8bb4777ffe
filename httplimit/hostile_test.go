package httplimit

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
)

// A limit keyed by route, in front of a handler that routes by the
// cleaned path (as http.FileServer and most routers do, and as the gate's
// own Path does), counts every spelling of a path as that one route: a
// hostile client sending "//login", "/./login" and "/a/../login" on the
// wire gets the route's quota once, not once per spelling (an audit got
// 2 requests through per spelling).
func TestHostileRouteSpellingsShareAQuota(t *testing.T) {
	p := floodgate.MustPolicy("login", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute})
	mw, err := New(Options{Config: gate.Config{Limits: []gate.Limit{{Name: "login", Policy: p, Key: []gate.Part{gate.Route(), gate.IP()}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	var codes []int
	for _, path := range []string{"/login", "//login", "/./login", "/a/../login", "/login/."} {
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if want := []int{200, 200, 429, 429, 429}; fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("statuses %v, want %v", codes, want)
	}
}
