// Command gubernator measures Gubernator's GLOBAL behaviour
// (github.com/gubernator-io/gubernator/v2 v2.13.0) on bench/cmd/wbload's
// workload: 4 Gubernator daemons in one process on loopback gRPC (each
// with its own listeners and peer connections), one key offered 10× its
// limit (1,000 per 1 s window, token bucket, Behavior GLOBAL: each daemon
// answers from its own copy of the owner's last broadcast and sends its
// hits to the owner every GlobalSyncWait), 16 paced callers a daemon (-callers). It
// reports, per sync wait, the admitted count per window beyond the limit
// (the overshoot) and the peer calls per decision (GetPeerRateLimits, the
// non-owners' hits to the owner, and UpdatePeerGlobals, the owner's
// broadcasts, counted by each daemon's gRPC stats). docs/BENCHMARKS.md,
// "Gubernator GLOBAL beside write-back".
//
// Its own module, so that neither Floodgate's module nor the bench module
// depends on Gubernator:
//
//	cd bench/gubernator && go run . -duration 10s
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
)

func main() {
	nodes := flag.Int("nodes", 4, "daemons deciding the key")
	limit := flag.Int64("limit", 1000, "the key's limit, requests a second")
	rate := flag.Int("rate", 10000, "requests a second offered, over all daemons")
	duration := flag.Duration("duration", 10*time.Second, "length of each run")
	waits := flag.String("sync-waits", "10ms,50ms", "GlobalSyncWait values, one run each")
	callers := flag.Int("callers", 16, "paced callers a daemon")
	flag.Parse()
	fmt.Printf("%d Gubernator daemons (v2.13.0, Behavior GLOBAL, token bucket), one key limited to %d/s, %d requests/s offered, %s a run\n\n",
		*nodes, *limit, *rate, *duration)
	fmt.Println("| GlobalSyncWait | decisions (per s) | peer calls | calls/decision | windows | overshoot mean | overshoot max | errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, w := range strings.Split(*waits, ",") {
		wait, err := time.ParseDuration(w)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := run(*nodes, *callers, *limit, *rate, *duration, wait); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

// freeAddr returns a loopback address with a port free now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// spawn starts n daemons that know each other (as gubernator's own
// cluster package does, with GlobalSyncWait wait).
func spawn(n int, wait time.Duration) ([]*guber.Daemon, error) {
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	var ds []*guber.Daemon
	var peers []guber.PeerInfo
	for range n {
		g, err := freeAddr()
		if err != nil {
			return ds, err
		}
		h, err := freeAddr()
		if err != nil {
			return ds, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := guber.SpawnDaemon(ctx, guber.DaemonConfig{
			Logger: log.WithField("instance", g), InstanceID: g,
			GRPCListenAddress: g, HTTPListenAddress: h, AdvertiseAddress: g,
			Behaviors: guber.BehaviorConfig{GlobalSyncWait: wait, GlobalTimeout: time.Second, BatchTimeout: time.Second},
		})
		cancel()
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
		peers = append(peers, guber.PeerInfo{GRPCAddress: g, HTTPAddress: h})
	}
	for _, d := range ds {
		d.SetPeers(peers)
	}
	return ds, nil
}

type tally struct {
	mu        sync.Mutex
	byReset   map[int64]int64 // admitted, by the window's reset time (ms)
	decisions int64
	errs      int64
}

func run(nodes, callers int, limit int64, rate int, d, wait time.Duration) error {
	ds, err := spawn(nodes, wait)
	defer func() {
		for _, x := range ds {
			x.Close()
		}
	}()
	if err != nil {
		return err
	}
	t := &tally{byReset: map[int64]int64{}}
	every := time.Duration(int64(time.Second) * int64(nodes*callers) / int64(rate))
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, x := range ds {
		c, err := guber.DialV1Server(x.GRPCListeners[0].Addr().String(), nil)
		if err != nil {
			return err
		}
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				call(c, t, limit, every, time.Duration(i)*every/time.Duration(callers), end)
			}()
		}
	}
	wg.Wait()
	time.Sleep(3 * wait) // the last hits reach the owner
	calls := int64(0)
	for _, x := range ds {
		n, err := peerCalls(x.HTTPListener.Addr().String())
		if err != nil {
			return err
		}
		calls += n
	}
	report(t, limit, calls, wait, d)
	return nil
}

// call decides one request every `every` until end, from offset.
func call(c guber.V1Client, t *tally, limit int64, every, offset time.Duration, end time.Time) {
	req := &guber.GetRateLimitsReq{Requests: []*guber.RateLimitReq{{Name: "hot", UniqueKey: "k", Hits: 1, Limit: limit,
		Duration: 1000, Algorithm: guber.Algorithm_TOKEN_BUCKET, Behavior: guber.Behavior_GLOBAL}}}
	next := time.Now().Add(offset)
	for {
		time.Sleep(time.Until(next))
		if time.Now().After(end) {
			return
		}
		next = next.Add(every)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.GetRateLimits(ctx, req)
		cancel()
		t.mu.Lock()
		t.decisions++
		switch {
		case err != nil || len(resp.Responses) != 1 || resp.Responses[0].Error != "":
			t.errs++
		case resp.Responses[0].Status == guber.Status_UNDER_LIMIT:
			t.byReset[resp.Responses[0].ResetTime]++
		}
		t.mu.Unlock()
	}
}

// report prints a run's row: windows are the reset times the responses
// named, the first and the last (partial) left out, and reset times
// within 500 ms of each other taken for one window (the owner's and the
// non-owners' copies of it, whose reset times differ).
func report(t *tally, limit, calls int64, wait, d time.Duration) {
	resets := make([]int64, 0, len(t.byReset))
	for r := range t.byReset {
		resets = append(resets, r)
	}
	slices.Sort(resets)
	var wins, spans []int64
	last, first := int64(-1<<62), int64(0)
	for _, r := range resets {
		if r-last > 500 {
			wins = append(wins, 0)
			spans = append(spans, 0)
			first = r
		}
		wins[len(wins)-1] += t.byReset[r]
		spans[len(spans)-1] = r - first
		last = r
	}
	if len(wins) > 2 {
		wins, spans = wins[1:len(wins)-1], spans[1:len(spans)-1]
	}
	var sum, most int64
	for _, w := range wins {
		o := max(0, w-limit)
		sum += o
		most = max(most, o)
	}
	mean := 0.0
	if len(wins) > 0 {
		mean = float64(sum) / float64(len(wins)) / float64(limit) * 100
	}
	fmt.Printf("| %s | %d (%.0f) | %d | %.3f | %d | +%.1f%% | +%.1f%% | %d |\n", wait, t.decisions, float64(t.decisions)/d.Seconds(), calls,
		float64(calls)/float64(max(1, t.decisions)), len(wins), mean, float64(most)/float64(limit)*100, t.errs)
	fmt.Fprintf(os.Stderr, "admitted per window (%s): %v; reset times in each, spread (ms): %v\n", wait, wins, spans)
}

// peerCalls sums a daemon's served peer RPCs from its /metrics.
func peerCalls(httpAddr string) (int64, error) {
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var n int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "gubernator_grpc_request_counts{") || !strings.Contains(line, "PeersV1/") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, err
		}
		n += int64(v)
	}
	return n, sc.Err()
}
