package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const quotaRules = `domain: quota
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 1000
`

// The reproduction (#17, item 2), as an operator saw it: serve
// --max-memory 64KiB; five keys spend a 1000/day quota; then 40,000 new
// keys each spend theirs whole (hits_addend 1000). The memory store
// evicted the spent keys at its cap as readily as the flood's, and all
// five read 1000 remaining afterwards. Now they stay spent, at either cap;
// the flood's keys past the cap are refused, decided by the rule's failure
// mode (open), and /metrics and the log say so.
func TestServeFloodAtMemoryCapForgivesNoSpentKey(t *testing.T) {
	for _, c := range []struct{ flag, value, metric string }{
		{"--max-memory", "64KiB", "floodgate_memstore_max_bytes 65536"},
		{"--max-keys", "1000", "floodgate_memstore_max_keys 1000"},
	} {
		t.Run(c.flag[2:], func(t *testing.T) {
			dir := t.TempDir()
			writeRules(t, dir, "quota.yaml", quotaRules)
			s := startServer(t, "--rules", dir, "--data", t.TempDir(), c.flag, c.value)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			ask := func(hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
				t.Helper()
				resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "quota", HitsAddend: hits, Descriptors: ds})
				if err != nil {
					t.Fatalf("ShouldRateLimit: %v", err)
				}
				return resp
			}
			for v := range 5 {
				if r := ask(1000, desc("user", "victim"+strconv.Itoa(v))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
					t.Fatalf("victim %d spends its quota: %v", v, r)
				}
			}
			start := time.Now()
			const flood, perCall = 40_000, 64
			for i := 0; i < flood; i += perCall {
				ds := make([]*rlcommon.RateLimitDescriptor, 0, perCall)
				for k := i; k < min(i+perCall, flood); k++ {
					ds = append(ds, desc("user", "flood"+strconv.Itoa(k)))
				}
				if r := ask(1000, ds...); r.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("flood keys from %d: %v; want admitted (held, or refused failing open)", i, r)
				}
			}
			took := time.Since(start)
			for v := range 5 {
				d := desc("user", "victim"+strconv.Itoa(v))
				d.HitsAddend = wrapperspb.UInt64(0) // check, consume nothing
				if r := ask(1, d); r.Statuses[0].LimitRemaining != 0 {
					t.Errorf("victim %d after the flood: %d remaining, want 0 (still spent)", v, r.Statuses[0].LimitRemaining)
				}
			}
			refused := metricValue(t, s.http, "floodgate_memstore_refused_total")
			keys := metricValue(t, s.http, "floodgate_memstore_keys")
			if refused < flood/2 || keys+refused < flood || metricValue(t, s.http, "floodgate_memstore_constraining_evictions_total") != 0 {
				t.Errorf("/metrics: %v keys, %v refused; want most of the flood refused, the rest held, and no constraining eviction", keys, refused)
			}
			metricValue(t, s.http, "floodgate_memstore_evictions_total")
			metricValue(t, s.http, "floodgate_memstore_bytes")
			if !strings.Contains(metricsText(t, s.http), c.metric+"\n") {
				t.Errorf("/metrics lacks %q", c.metric)
			}
			// logged, at most once every 10 s
			lines := strings.Count(s.logs(), "no room for new keys")
			if lines < 1 || lines > int(took/(10*time.Second))+2 {
				t.Errorf("%d log lines about refusals in %v, want 1 every 10 s at most", lines, took)
			}
		})
	}
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// --max-keys (and FLOODGATE_MAX_KEYS) takes a whole number of keys, more
// than 0, for serve and proxy alike; anything else is an error naming the
// flag (or the variable). The default is memstore's, 4,194,304.
func TestMaxKeysFlag(t *testing.T) {
	parse := map[string]func(args []string) (*commonConfig, error){
		"serve": func(args []string) (*commonConfig, error) {
			c, err := serveFlags(args, io.Discard)
			if err != nil {
				return nil, err
			}
			return &c.commonConfig, nil
		},
		"proxy": func(args []string) (*commonConfig, error) {
			c, err := proxyFlags(append([]string{"--upstream", "http://127.0.0.1:1"}, args...), io.Discard)
			if err != nil {
				return nil, err
			}
			return &c.commonConfig, nil
		},
	}
	const env = "FLOODGATE_MAX_KEYS"
	unset := func() { t.Setenv(env, ""); os.Unsetenv(env) } // restored after the test
	for cmd, parse := range parse {
		unset()
		if c, err := parse(nil); err != nil || c.maxKeys != 1<<22 {
			t.Errorf("%s: default %v, %v; want 4194304", cmd, c, err)
		}
		if c, err := parse([]string{"--max-keys", "1000"}); err != nil || c.maxKeys != 1000 {
			t.Errorf("%s --max-keys 1000: %v, %v", cmd, c, err)
		}
		t.Setenv(env, "2000")
		if c, err := parse(nil); err != nil || c.maxKeys != 2000 {
			t.Errorf("%s %s=2000: %v, %v", cmd, env, c, err)
		}
		if c, err := parse([]string{"--max-keys", "1000"}); err != nil || c.maxKeys != 1000 {
			t.Errorf("%s --max-keys 1000 with %s=2000: %v, %v; the flag wins", cmd, env, c, err)
		}
		unset()
		for _, v := range []string{"bogus", "0", "-1", "", "1e6", "1.5", "99999999999999999999"} {
			if _, err := parse([]string{"--max-keys", v}); err == nil || !strings.Contains(err.Error(), "max-keys") {
				t.Errorf("%s --max-keys %q: %v, want an error naming the flag", cmd, v, err)
			}
			t.Setenv(env, v)
			if _, err := parse(nil); err == nil || !strings.Contains(err.Error(), env+"=") {
				t.Errorf("%s %s=%q: %v, want an error naming the variable", cmd, env, v, err)
			}
			unset()
		}
	}
}

// The proxy's /metrics shows its memory store too, with the caps it was
// given.
func TestProxyMetricsShowMemoryStore(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--max-keys", "16", "--max-memory", "1MiB")
	if code, _, _ := proxyGet(t, "http://"+p.addrs["proxy"]+"/limited/a"); code != 200 {
		t.Fatalf("through the proxy: %d", code)
	}
	admin := p.addrs["admin"]
	for name, want := range map[string]float64{
		"floodgate_memstore_keys": 1, "floodgate_memstore_max_keys": 16, "floodgate_memstore_max_bytes": 1 << 20,
		"floodgate_memstore_refused_total": 0, "floodgate_memstore_evictions_total": 0, "floodgate_memstore_constraining_evictions_total": 0,
		"floodgate_memstore_journal_errors_total": 0, "floodgate_memstore_journal_lost_records_total": 0,
	} {
		if got := metricValue(t, admin, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := metricValue(t, admin, "floodgate_memstore_bytes"); got <= 0 {
		t.Errorf("floodgate_memstore_bytes = %v", got)
	}
	// The decision was journaled (the journal is on by default).
	if got := metricValue(t, admin, "floodgate_memstore_journal_records_total"); got < 1 {
		t.Errorf("floodgate_memstore_journal_records_total = %v, want the decision's record", got)
	}
}
