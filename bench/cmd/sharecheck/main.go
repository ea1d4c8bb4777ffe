// Command sharecheck drives one hot key through several `floodgate serve`
// nodes at a fixed offered rate and counts, per fixed window, the requests
// admitted: over the limit (a window that admitted more than it), and
// undershoot (the limit less what was admitted, in windows offered more
// than the limit). A request whose round trip spans a window's end is
// counted in the window it was sent in and reported apart (edge). It
// reads each node's floodgate_store_calls_total before and after, for the
// Redis calls per decision. bench/share.sh runs it.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	addrs := flag.String("addrs", "", "comma-separated gRPC host:port of the nodes")
	metrics := flag.String("metrics", "", "comma-separated HTTP host:port of the nodes (/metrics)")
	rate := flag.Float64("rate", 10000, "offered requests/s, over all nodes")
	dur := flag.Duration("duration", 10*time.Second, "how long")
	window := flag.Duration("window", time.Second, "the rule's window")
	limit := flag.Int("limit", 1000, "the rule's limit")
	domain := flag.String("domain", "share", "domain")
	key := flag.String("key", "hot", "descriptor key (value k)")
	workers := flag.Int("workers", 64, "concurrent senders")
	flag.Parse()
	var clients []rlsv3.RateLimitServiceClient
	for _, a := range strings.Split(*addrs, ",") {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	req := &rlsv3.RateLimitRequest{Domain: *domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: *key, Value: "k"}}}}}
	before := calls(*metrics)

	w := int64(*window)
	var mu sync.Mutex
	sure, edge, asked := map[int64]int{}, map[int64]int{}, map[int64]int{}
	var n, errs atomic.Int64
	start := time.Now()
	end := start.Add(*dur)
	gap := time.Duration(float64(time.Second) * float64(*workers) / *rate)
	var wg sync.WaitGroup
	for i := range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := start.Add(gap * time.Duration(i) / time.Duration(*workers))
			for k := i; ; k++ {
				time.Sleep(time.Until(next))
				next = next.Add(gap)
				if time.Now().After(end) {
					return
				}
				sent := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := clients[k%len(clients)].ShouldRateLimit(ctx, req)
				cancel()
				got := time.Now()
				n.Add(1)
				if err != nil {
					errs.Add(1)
					continue
				}
				a, b := sent.UnixNano()/w, got.UnixNano()/w
				mu.Lock()
				asked[a]++
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					if a == b {
						sure[a]++
					} else {
						edge[a]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	after := calls(*metrics)

	var ws []int64
	for k := range asked {
		ws = append(ws, k)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i] < ws[j] })
	over, full := 0, 0
	var under, maxUnder float64
	for i, k := range ws {
		adm := sure[k] + edge[k]
		fmt.Printf("window %d: asked %d admitted %d (edge %d)\n", k, asked[k], adm, edge[k])
		if sure[k] > *limit {
			over++
		}
		if i == 0 || i == len(ws)-1 || asked[k] <= *limit { // partial, or not saturated
			continue
		}
		full++
		u := float64(*limit-adm) / float64(*limit)
		under += u
		maxUnder = max(maxUnder, u)
	}
	res := map[string]any{
		"requests": n.Load(), "errors": errs.Load(), "windows_full": full, "windows_over_limit": over,
		"undershoot_total_pct": 100 * under / float64(max(full, 1)), "undershoot_worst_window_pct": 100 * maxUnder,
		"redis_calls": after - before, "redis_calls_per_decision": float64(after-before) / float64(max(n.Load(), 1)),
		"requests_per_s": float64(n.Load()) / time.Since(start).Seconds(),
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
}

// calls sums floodgate_store_calls_total over the nodes' /metrics.
func calls(addrs string) int64 {
	if addrs == "" {
		return 0
	}
	var sum int64
	for _, a := range strings.Split(addrs, ",") {
		resp, err := http.Get("http://" + a + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "floodgate_store_calls_total "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				sum += int64(f)
			}
		}
		resp.Body.Close()
	}
	return sum
}
