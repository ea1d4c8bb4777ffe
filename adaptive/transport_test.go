package adaptive_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/adaptive"
	"github.com/floodgate/floodgate/clock"
)

// backend is a real HTTP server that accepts at most capacity requests
// per second of the test's clock (capacity < 0: all) and answers the rest
// 503, and logs every arrival.
type backend struct {
	clk      *clock.Manual
	mu       sync.Mutex
	capacity int
	second   int64
	used     int
	arrivals []arrival
	rnd      *rand.Rand // failRate's draws
	failRate float64    // if > 0: refuse this share, whatever the capacity
}

type arrival struct {
	at       int64 // microseconds on the test's clock
	id       string
	accepted bool
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	now := b.clk.NowMicro()
	if s := now / 1e6; s != b.second {
		b.second, b.used = s, 0
	}
	ok := b.capacity < 0 || b.used < b.capacity
	if b.failRate > 0 {
		ok = b.rnd.Float64() >= b.failRate
	}
	if ok {
		b.used++
	}
	b.arrivals = append(b.arrivals, arrival{at: now, id: r.Header.Get("X-Id"), accepted: ok})
	b.mu.Unlock()
	if !ok {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

func (b *backend) set(capacity int) {
	b.mu.Lock()
	b.capacity = capacity
	b.mu.Unlock()
}

// received returns how many requests arrived in [from, to).
func (b *backend) received(from, to int64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, a := range b.arrivals {
		if a.at >= from && a.at < to {
			n++
		}
	}
	return n
}

// drive sends n requests through c, one per step of the clock, and
// returns how many were dropped locally.
func drive(t *testing.T, c *http.Client, clk *clock.Manual, url string, n int, step time.Duration) int {
	t.Helper()
	dropped := 0
	for range n {
		resp, err := c.Get(url)
		switch {
		case errors.Is(err, adaptive.ErrThrottled):
			dropped++
		case err != nil:
			t.Fatal(err)
		default:
			resp.Body.Close()
		}
		clk.Advance(step)
	}
	return dropped
}

// Against a real server of capacity 20 per second driven at 100 per
// second, the client sends about K·20 = 40 per second and drops the other
// 60% locally (the server's own count of arrivals says so); when the
// server recovers, the client stops dropping within a few windows.
func TestBacksOffAndRecovers(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_000_000, 0))
	be := &backend{clk: clk, capacity: 20}
	srv := httptest.NewServer(be)
	defer srv.Close()
	th := newThrottle(t, clk, adaptive.Options{Window: 10 * time.Second, Buckets: 20})
	c := &http.Client{Transport: &adaptive.Transport{Throttle: th}}
	const rate, step = 100, 10 * time.Millisecond

	drive(t, c, clk, srv.URL, 3*10*rate, step) // three windows to settle
	from := clk.NowMicro()
	dropped := drive(t, c, clk, srv.URL, 10*rate, step) // one window, measured
	sent := be.received(from, clk.NowMicro())
	if sent+dropped != 10*rate {
		t.Fatalf("sent %d + dropped %d != %d", sent, dropped, 10*rate)
	}
	share := float64(sent) / float64(10*rate)
	t.Logf("overloaded: sent %.3f of the requests (K·capacity/demand = 0.4), dropped %d locally", share, dropped)
	if math.Abs(share-0.4) > 0.05 {
		t.Fatalf("sent %.3f of the requests; want 0.4 ± 0.05", share)
	}

	be.set(-1) // recovered
	windows := 0
	for ; windows < 8; windows++ {
		if drive(t, c, clk, srv.URL, 10*rate, step) == 0 {
			break
		}
	}
	if windows == 8 {
		t.Fatal("still dropping 8 windows after the server recovered")
	}
	t.Logf("a window without a drop %d windows after the recovery", windows+1)
	if p := th.DropProbability(srvHost(srv)); p != 0 {
		t.Fatalf("recovered: p = %v", p)
	}
}

// A server refusing everything: the client drops nearly all locally but
// still lets a few through, to learn of a recovery.
func TestBacksOffAgainstADeadServer(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_000_000, 0))
	be := &backend{clk: clk, capacity: 0}
	srv := httptest.NewServer(be)
	defer srv.Close()
	th := newThrottle(t, clk, adaptive.Options{Window: 10 * time.Second})
	c := &http.Client{Transport: &adaptive.Transport{Throttle: th}}
	drive(t, c, clk, srv.URL, 1000, 10*time.Millisecond)
	from := clk.NowMicro()
	dropped := drive(t, c, clk, srv.URL, 1000, 10*time.Millisecond)
	sent := be.received(from, clk.NowMicro())
	if sent == 0 || dropped < 950 {
		t.Fatalf("against a dead server: sent %d, dropped %d of 1000; want a few probes and at least 950 dropped", sent, dropped)
	}
}

// Retries against a server refusing half the requests: the server's own
// log shows retries (arrivals of an id seen before) never past 10% of the
// originals plus 5 in any window, though far more were wanted.
func TestRetryBudgetNeverExceeded(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_000_000, 0))
	be := &backend{clk: clk, capacity: -1, failRate: 0.5, rnd: rand.New(rand.NewPCG(3, 4))}
	srv := httptest.NewServer(be)
	defer srv.Close()
	const window, buckets = 10 * time.Second, 10
	th := newThrottle(t, clk, adaptive.Options{Window: window, Buckets: buckets, RetryRatio: 0.1, MinRetries: 5})
	c := &http.Client{Transport: &adaptive.Transport{Throttle: th, Retries: 3}}
	const n = 3000
	issued := make([]int64, n) // each original's time
	for i := range n {
		issued[i] = clk.NowMicro()
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-Id", strconv.Itoa(i))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		} else if !errors.Is(err, adaptive.ErrThrottled) {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Millisecond)
	}
	bucket := (window / buckets).Microseconds()
	originals, retries := map[int64]int{}, map[int64]int{}
	for _, at := range issued {
		originals[at/bucket]++
	}
	seen := map[string]bool{}
	gaveUp, wanted := 0, 0
	for _, a := range be.arrivals {
		if seen[a.id] {
			retries[a.at/bucket]++
		}
		seen[a.id] = true
	}
	// an id whose every arrival was refused and that came fewer than 4
	// times: the budget stopped its retries
	last := map[string]arrival{}
	count := map[string]int{}
	for _, a := range be.arrivals {
		last[a.id] = a
		count[a.id]++
	}
	for id, a := range last {
		if !a.accepted {
			wanted++
			if count[id] < 4 {
				gaveUp++
			}
		}
	}
	total := 0
	first, lastB := issued[0]/bucket, issued[n-1]/bucket
	for end := first; end <= lastB; end++ {
		r, o := 0, 0
		for b := end - buckets + 1; b <= end; b++ {
			r += retries[b]
			o += originals[b]
		}
		if float64(r) > 0.1*float64(o)+5 {
			t.Fatalf("window ending in bucket %d: %d retries for %d originals; budget 10%% + 5", end-first, r, o)
		}
	}
	for _, r := range retries {
		total += r
	}
	t.Logf("%d retries sent for %d originals; %d requests refused in the end, %d of them cut short by the budget", total, n, wanted, gaveUp)
	if total < n/20 || gaveUp == 0 {
		t.Fatalf("the budget was never used (%d retries) or never binding (%d cut short): the test is vacuous", total, gaveUp)
	}
}

func srvHost(s *httptest.Server) string { return s.Listener.Addr().String() }
