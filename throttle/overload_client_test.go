package throttle

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOverloadClient is TestOverload's load generator, run as a child
// process (FLOODGATE_OVERLOAD_URL set); otherwise it does nothing. It
// reads commands on stdin: "hello"; "cap MS" (closed loop, 8 clients, MS
// milliseconds); "rate RPS", "load", "warm" (record from now), "stop"
// (answers "n ok crit critOK clientP99ns"); "quit". Answers are lines
// "ANSWER ...".
func TestOverloadClient(t *testing.T) {
	url := os.Getenv("FLOODGATE_OVERLOAD_URL")
	if url == "" {
		t.Skip("run by TestOverload")
	}
	g := &generator{url: url, client: newLoadHTTPClient(url)}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "hello":
			answer("")
		case "cap":
			ms, _ := strconv.Atoi(arg)
			g.closedLoop(time.Duration(ms) * time.Millisecond)
			answer("")
		case "rate":
			r, _ := strconv.ParseFloat(arg, 64)
			g.rate.Store(math.Float64bits(r))
		case "load":
			g.start()
		case "warm":
			g.record.Store(true)
		case "stop":
			answer(g.stop())
		case "quit":
			return
		}
	}
}

func answer(s string) { fmt.Println("ANSWER " + s) }

// newLoadHTTPClient returns a client with 2,048 connections opened at
// once and never more: an open-loop client dialing afresh overflows the
// listen backlog, and a dropped SYN costs a second of the host's latency,
// not the throttler's. They are enough for 3× capacity at the longest
// latency the throttler allows; a request that nevertheless waits for
// one is not offered when it should be, so it fails after 5 s (a
// CRITICAL one counts against the test) instead of succeeding late.
func newLoadHTTPClient(url string) *http.Client {
	const conns = 2048
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}, Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			if resp, err := client.Get(url + "/nothing"); err == nil {
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	return client
}

type generator struct {
	url    string
	client *http.Client
	rate   atomic.Uint64 // float64 bits, requests/s
	record atomic.Bool
	done   chan struct{}
	loop   sync.WaitGroup // the pacing loop
	reqs   sync.WaitGroup // requests in flight

	mu      sync.Mutex
	results []result
}

type result struct {
	crit, ok bool
	latency  time.Duration
}

// send sends one request of the mix: 20% dear, independent of the level
// (CRITICAL for i%5 == 1).
func (g *generator) send(i int) result {
	path, level := "/cheap", "SHEDDABLE"
	if (i/5)%5 == 0 {
		path = "/dear"
	}
	if i%5 == 1 {
		level = "CRITICAL"
	}
	req, _ := http.NewRequest("GET", g.url+path, nil)
	req.Header.Set("X-Criticality", level)
	start := time.Now()
	resp, err := g.client.Do(req)
	r := result{crit: level == "CRITICAL", latency: time.Since(start)}
	if err != nil {
		return r
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	r.ok = resp.StatusCode == 200
	return r
}

func (g *generator) closedLoop(d time.Duration) {
	start := time.Now()
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := c; time.Since(start) < d; i += 8 {
				g.send(i)
			}
		})
	}
	wg.Wait()
}

// start offers open-loop load at the current rate until stop.
func (g *generator) start() {
	g.done = make(chan struct{})
	g.loop.Go(func() {
		start, last, due, sent := time.Now(), time.Duration(0), 0.0, 0
		for {
			select {
			case <-g.done:
				return
			default:
			}
			el := time.Since(start)
			due += math.Float64frombits(g.rate.Load()) * (el - last).Seconds()
			last = el
			for ; float64(sent) < due; sent++ {
				i := sent
				g.reqs.Go(func() {
					r := g.send(i)
					if g.record.Load() {
						g.mu.Lock()
						g.results = append(g.results, r)
						g.mu.Unlock()
					}
				})
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// stop ends the load, waits for the answers and sums them up.
func (g *generator) stop() string {
	close(g.done)
	g.loop.Wait()
	g.reqs.Wait()
	var n, ok, crit, critOK int
	var lat []time.Duration
	for _, r := range g.results {
		n++
		if r.ok {
			ok++
			lat = append(lat, r.latency)
		}
		if r.crit {
			crit++
			if r.ok {
				critOK++
			}
		}
	}
	var p99 time.Duration
	if len(lat) > 0 {
		slices.Sort(lat)
		p99 = lat[len(lat)*99/100]
	}
	return fmt.Sprintf("%d %d %d %d %d", n, ok, crit, critOK, p99)
}
