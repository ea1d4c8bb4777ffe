package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// throttledProxy is a proxy with a throttler in front of an upstream
// that holds requests to /held until release is closed.
type throttledProxy struct {
	p       *Proxy
	th      *throttle.Throttler
	addr    string
	release func()
	arrived atomic.Int64
	mu      sync.Mutex
	paths   []string
}

func serveThrottled(t *testing.T, tc throttle.Config, trusted []netip.Prefix, limits ...gate.Limit) *throttledProxy {
	t.Helper()
	return serveThrottledClock(t, tc, clock.Coarse, trusted, limits...)
}

// serveThrottledClock is serveThrottled with the gate on clk (wrapped in
// Clock, as floodgate proxy's).
func serveThrottledClock(t *testing.T, tc throttle.Config, clk floodgate.Clock, trusted []netip.Prefix, limits ...gate.Limit) *throttledProxy {
	t.Helper()
	tp := &throttledProxy{th: throttle.New(tc)}
	hold := make(chan struct{})
	var once sync.Once
	tp.release = func() { once.Do(func() { close(hold) }) }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tp.arrived.Add(1)
		tp.mu.Lock()
		tp.paths = append(tp.paths, r.URL.Path)
		tp.mu.Unlock()
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		if r.URL.Path == "/held" {
			<-hold
		}
		io.WriteString(w, "ok") //nolint:errcheck
	}))
	t.Cleanup(up.Close)
	t.Cleanup(tp.release) // before up.Close
	u, _ := url.Parse(up.URL)
	p, err := New(Config{Upstream: u, Throttle: tp.th, TrustedProxies: trusted})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Clock: Clock(clk), Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	p.SetGate(g)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l) //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { p.Shutdown(t.Context()) })
	tp.p, tp.addr = p, l.Addr().String()
	return tp
}

// hold sends GET /held and waits until it holds the throttler's slot.
func (tp *throttledProxy) hold(t *testing.T) chan int {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + tp.addr + "/held")
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	waitUntil(t, "the slot held", func() bool { return tp.th.Stats().InFlight == 1 && tp.arrived.Load() >= 1 })
	return done
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// get sends GET path from the address from with the headers hdr (name,
// value, ...) on a connection of its own and returns the status.
func (tp *throttledProxy) get(t *testing.T, from, path string, hdr ...string) int {
	t.Helper()
	c := dialFrom(t, from, tp.addr)
	defer c.Close()
	req := "GET " + path + " HTTP/1.1\r\nHost: x\r\n"
	for i := 0; i+1 < len(hdr); i += 2 {
		req += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	io.WriteString(c, req+"\r\n") //nolint:errcheck
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return resp.StatusCode
}

// TestShedOnHeader: with the throttler's one slot held and no queue, a
// request with a body is answered 503 as soon as its header is read —
// the client never sends a byte of the body (a 1 GiB length, a chunked
// body, an Expect: 100-continue) — without a 100 Continue, and the
// connection closes; the upstream sees none of them.
func TestShedOnHeader(t *testing.T) {
	tp := serveThrottled(t, throttle.Config{Limit: 1}, nil)
	held := tp.hold(t)
	for _, hdr := range []string{
		"Content-Length: 1073741824\r\n",
		"Transfer-Encoding: chunked\r\n",
		"Content-Length: 1073741824\r\nExpect: 100-continue\r\n",
	} {
		c := dialFrom(t, "127.0.0.1", tp.addr)
		io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: x\r\n"+hdr+"\r\n") //nolint:errcheck
		// read to the close: the body is never sent
		b, err := io.ReadAll(c)
		if err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("%q: %v after %q", hdr, err, b)
		}
		s := string(b)
		if !strings.HasPrefix(s, "HTTP/1.1 503 ") || !strings.Contains(s, "Retry-After: 1\r\n") ||
			!strings.Contains(s, "Connection: close\r\n") || strings.Contains(s, "100 Continue") || strings.Count(s, "HTTP/1.1 ") != 1 {
			t.Errorf("%q: read %q; want one 503 with Retry-After and Connection: close, before any body", hdr, s)
		}
	}
	tp.release()
	if st := <-held; st != 200 {
		t.Errorf("the held request: %d", st)
	}
	if st := tp.th.Stats(); st.Refused[throttle.Critical] != 3 || st.InFlight != 0 {
		t.Errorf("throttler after: %+v; want 3 shed", st)
	}
	if n := tp.arrived.Load(); n != 1 {
		t.Errorf("the upstream saw %d requests; want the held one", n)
	}
}

// TestShedSpendsNoQuotaProxy: requests the throttler sheds never reach
// the gate: a client whose 5 requests were shed still has its quota of 2
// and gets exactly 2 through, then 429; and 30 concurrent requests of
// one client with a quota of 5, through 4 slots and a deep queue, get
// exactly 5 to the upstream (admission first lets none past its quota).
func TestShedSpendsNoQuotaProxy(t *testing.T) {
	pol := func(n int64) *floodgate.Policy {
		return floodgate.MustPolicy(fmt.Sprint("q", n), floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: n, Period: time.Hour})
	}
	tp := serveThrottled(t, throttle.Config{Limit: 1}, nil,
		gate.Limit{Name: "q", Policy: pol(2), Match: gate.Match{PathPrefix: "/q/"}, Key: []gate.Part{gate.IP()}})
	held := tp.hold(t)
	for range 5 {
		if st := tp.get(t, "127.0.0.2", "/q/x"); st != 503 {
			t.Errorf("at a full server: %d, want 503", st)
		}
	}
	tp.release()
	<-held
	for i, want := range []int{200, 200, 429, 429} {
		if st := tp.get(t, "127.0.0.2", "/q/x"); st != want {
			t.Errorf("after the load, request %d: %d, want %d (the 5 shed spent none of the 2)", i+1, st, want)
		}
	}
	if st := tp.th.Stats(); st.InFlight != 0 || st.Completions != 3 {
		t.Errorf("throttler: %+v; want 3 completions (the held and the 2), the 429s released", st)
	}

	tp2 := serveThrottled(t, throttle.Config{Limit: 4, MaxQueueCost: time.Hour}, nil,
		gate.Limit{Name: "p", Policy: pol(5), Key: []gate.Part{gate.IP()}})
	var wg sync.WaitGroup
	codes := make(chan int, 30)
	for range 30 {
		wg.Go(func() {
			resp, err := http.Get("http://" + tp2.addr + "/p")
			if err != nil {
				codes <- -1
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	n := map[int]int{}
	for c := range codes {
		n[c]++
	}
	if n[200] != 5 || n[429] != 25 || tp2.arrived.Load() != 5 {
		t.Errorf("30 concurrent, quota 5: %v, upstream saw %d; want 5 × 200, 25 × 429", n, tp2.arrived.Load())
	}
}

// TestProxyRouteCriticality: with one slot held and no queue, every
// request is shed at once and counted under the level it entered with:
// an untrusted client claiming CRITICAL_PLUS enters at its route's level
// (SHEDDABLE on /batch/) or the default (CRITICAL) elsewhere; a lower
// claim is kept; a trusted proxy's claim is taken as it is.
func TestProxyRouteCriticality(t *testing.T) {
	pol := floodgate.MustPolicy("big", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1000, Period: time.Second})
	tp := serveThrottled(t, throttle.Config{Limit: 1}, []netip.Prefix{netip.MustParsePrefix("127.0.0.3/32")},
		gate.Limit{Name: "batch", Policy: pol, Match: gate.Match{PathPrefix: "/batch/"}, Criticality: "SHEDDABLE"},
		gate.Limit{Name: "rest", Policy: pol})
	held := tp.hold(t)
	for _, c := range []struct {
		from, path, claim string
		want              throttle.Criticality
	}{
		{"127.0.0.1", "/batch/x", "CRITICAL_PLUS", throttle.Sheddable},
		{"127.0.0.1", "/batch/x", "", throttle.Sheddable},
		{"127.0.0.1", "/other", "CRITICAL_PLUS", throttle.Critical},
		{"127.0.0.1", "/other", "SHEDDABLE_PLUS", throttle.SheddablePlus},
		{"127.0.0.3", "/batch/x", "CRITICAL_PLUS", throttle.CriticalPlus},
		{"127.0.0.3", "/batch/x", "", throttle.Sheddable},
	} {
		before := tp.th.Stats().Refused
		var hdr []string
		if c.claim != "" {
			hdr = []string{"X-Criticality", c.claim}
		}
		if st := tp.get(t, c.from, c.path, hdr...); st != 503 {
			t.Fatalf("%+v: %d, want 503", c, st)
		}
		after := tp.th.Stats().Refused
		if after[c.want] != before[c.want]+1 {
			t.Errorf("%s %s claiming %q: shed counts %v → %v; want one more %v", c.from, c.path, c.claim, before, after, c.want)
		}
	}
	tp.release()
	<-held
}

// TestAdmittedBodyFailsReleases: a request admitted on its header whose
// body then fails — cut short by the client's close, within the first
// 8 KiB fasthttp reads before the handler (requestError), or past them
// while it streams to the upstream (forward) — gives its slot back: with
// one slot, the next request is admitted, and nothing stays in flight.
// Else a client could hold every slot with bodies it never sends.
func TestAdmittedBodyFailsReleases(t *testing.T) {
	tp := serveThrottled(t, throttle.Config{Limit: 1}, nil)
	for _, c := range []struct{ length, sent int }{{100, 10}, {1 << 20, 20000}} {
		before := tp.th.Stats().Admitted
		conn := dialFrom(t, "127.0.0.1", tp.addr)
		fmt.Fprintf(conn, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", c.length, strings.Repeat("b", c.sent))
		waitUntil(t, "the cut request admitted", func() bool { return tp.th.Stats().Admitted > before })
		conn.Close()
		waitUntil(t, "its slot back", func() bool { return tp.th.Stats().InFlight == 0 })
		if st := tp.get(t, "127.0.0.1", "/next"); st != 200 {
			t.Fatalf("after a body cut at %d of %d bytes: the next request %d, want 200", c.sent, c.length, st)
		}
	}
	if st := tp.th.Stats(); st.InFlight != 0 || st.Refused != [4]uint64{} {
		t.Errorf("throttler after: %+v", st)
	}
}
