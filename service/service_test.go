package service_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

const testRules = `domain: t
all_or_nothing: false
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: a
    rate_limit:
      name: narrow
      unit: minute
      requests_per_unit: 2
  - key: b
    rate_limit:
      name: wide
      unit: minute
      requests_per_unit: 100
      replaces:
        - name: narrow
  - key: win
    rate_limit:
      unit: second
      unit_multiplier: 90
      requests_per_unit: 10
`

const aonRules = `domain: aon
all_or_nothing: true
descriptors:
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 1
`

// bothStores makes the stores a test runs on: nil for newEnv's memory
// store, and a Redis store on a redis-server of the test's own. Its
// timeout is no test's subject: generous, so that counts stay Redis's on
// a starved CI host (with the default 50 ms, calls there timed out and
// failure modes decided).
var bothStores = map[string]func(t *testing.T) floodgate.Store{
	"memory": func(t *testing.T) floodgate.Store { return nil },
	"redis": func(t *testing.T) floodgate.Store {
		st, err := redisstore.New("redis://"+redistest.Standalone(t).Addr, redisstore.Options{ClientTime: true, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	},
}

type env struct {
	svc *service.Service
	clk *clock.Manual
	ovr overrides.Store
}

// newEnv serves files' rules on a manual clock, with opts, on opts.Store
// or else a fresh memory store.
func newEnv(t *testing.T, opts service.Options, files ...string) *env {
	t.Helper()
	var ds []*rules.Domain
	for i, f := range files {
		d, err := rules.Parse("test"+string(rune('0'+i))+".yaml", []byte(f))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	cfg, err := rules.NewConfig(ds...)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	if opts.Store == nil {
		st := memstore.MustNew(memstore.Options{SweepInterval: -1})
		t.Cleanup(func() { st.Close() })
		opts.Store = st
	}
	opts.Clock = clk
	return &env{svc: service.New(cfg, opts), clk: clk, ovr: opts.Overrides}
}

// serveGRPC serves e's service over gRPC (service.GRPCOptions) on a free
// loopback port until the test ends, and returns its address.
func (e *env) serveGRPC(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(service.GRPCOptions()...)
	e.svc.RegisterGRPC(g)
	go g.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// dialGRPC returns a plaintext client connection to addr, closed when the
// test ends.
func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func d(kv ...string) *rlcommon.RateLimitDescriptor {
	out := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func (e *env) ask(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.svc.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

func TestHitsPeekAndRefund(t *testing.T) {
	e := newEnv(t, service.Options{}, testRules)
	req := func(hits uint32, dd *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "t", HitsAddend: hits, Descriptors: []*rlcommon.RateLimitDescriptor{dd}}
	}
	if r := e.ask(t, req(3, d("user", "u"))); r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("hits_addend 3: %v", r.Statuses[0])
	}
	peek := d("user", "u")
	peek.HitsAddend = wrapperspb.UInt64(0)
	if r := e.ask(t, req(0, peek)); r.Statuses[0].LimitRemaining != 2 || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("descriptor hits_addend 0 must check without consuming: %v", r.Statuses[0])
	}
	refund := d("user", "u")
	refund.HitsAddend, refund.IsNegativeHits = wrapperspb.UInt64(2), true
	if r := e.ask(t, req(0, refund)); r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("is_negative_hits must give back: %v", r.Statuses[0])
	}
	over := e.ask(t, req(5, d("user", "u")))
	if over.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || header(over, "Retry-After") == "" {
		t.Fatalf("over the limit: %v", over)
	}
	if got := header(over, "RateLimit"); !strings.Contains(got, ";r=4;") {
		t.Fatalf("RateLimit header %q", got)
	}
}

func TestBlockedReplacedAndMultiplier(t *testing.T) {
	e := newEnv(t, service.Options{XRateLimitHeaders: true}, testRules)
	r := e.ask(t, &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{d("blocked", "x")}})
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
		t.Fatalf("requests_per_unit 0 must block: %v", r)
	}
	// "wide" replaces "narrow": three requests pass though narrow allows 2.
	for i := range 3 {
		r := e.ask(t, &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{d("a", "1"), d("b", "1")}})
		if r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: the replaced limit still applied: %v", i, r)
		}
		if i == 0 && r.Statuses[1].CurrentLimit.GetName() != "wide" {
			t.Fatalf("current_limit.name %q", r.Statuses[1].CurrentLimit.GetName())
		}
	}
	r = e.ask(t, &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{d("win", "1")}})
	cl := r.Statuses[0].CurrentLimit
	if cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND && cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Fatalf("90 s window: unit %v", cl.GetUnit())
	}
	if header(r, "X-RateLimit-Limit") != "10" || header(r, "X-RateLimit-Remaining") != "9" {
		t.Fatalf("X-RateLimit headers: %v", r.ResponseHeadersToAdd)
	}
	if got := header(r, "RateLimit-Policy"); !strings.Contains(got, ";q=10;w=90") {
		t.Fatalf("RateLimit-Policy %q", got)
	}
}

func TestAllOrNothingAcrossDescriptors(t *testing.T) {
	e := newEnv(t, service.Options{}, aonRules)
	req := &rlsv3.RateLimitRequest{Domain: "aon", Descriptors: []*rlcommon.RateLimitDescriptor{d("ip", "1.2.3.4"), d("user", "u")}}
	if r := e.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(r)
	}
	for range 3 {
		r := e.ask(t, req)
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatal(r)
		}
		// The IP's status says what is left once its hit is given back.
		if ip := r.Statuses[0]; ip.Code != rlsv3.RateLimitResponse_OK || ip.LimitRemaining != 9 {
			t.Fatalf("the admitted and refunded IP: %v, want OK with 9 remaining", ip)
		}
	}
	// The three denied requests consumed nothing from the IP.
	peek := d("ip", "1.2.3.4")
	peek.HitsAddend = wrapperspb.UInt64(0)
	r := e.ask(t, &rlsv3.RateLimitRequest{Domain: "aon", Descriptors: []*rlcommon.RateLimitDescriptor{peek}})
	if r.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("IP remaining %d, want 9", r.Statuses[0].LimitRemaining)
	}
}

func TestRequestLimitsOnlyWhenAllowed(t *testing.T) {
	own := d("user", "v")
	own.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	req := &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{own}}
	off := newEnv(t, service.Options{}, testRules)
	off.ask(t, req)
	if r := off.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a descriptor's own limit honoured without --allow-request-limits: %v", r)
	}
	on := newEnv(t, service.Options{AllowRequestLimits: true}, testRules)
	on.ask(t, req)
	if r := on.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("the descriptor's own limit of 1/hour was not applied: %v", r)
	}
}

// overrideCache returns a cache of overrides over a fresh bbolt store.
func overrideCache(t *testing.T) *overrides.Cache {
	t.Helper()
	b, err := overrides.OpenBolt(t.TempDir() + "/o.db")
	if err != nil {
		t.Fatal(err)
	}
	cache := overrides.NewCache(b, 1024, 0)
	t.Cleanup(func() { cache.Close() })
	return cache
}

func TestOverridesReplaceTheRule(t *testing.T) {
	cache := overrideCache(t)
	e := newEnv(t, service.Options{Overrides: cache}, testRules)
	cfg := e.svc.Rules()
	m := cfg.Match("t", []rules.Entry{{Key: "user", Value: "241531"}})
	if err := cache.Put(context.Background(), overrides.Override{Domain: "t", Key: m.Key, Limit: 1, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", "241531")}}
	if r := e.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("override: %v", r)
	}
	if r := e.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second request under a 1/s override: %v", r)
	}
	e.clk.Advance(time.Second)
	if r := e.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after a second: %v", r)
	}
	// Other users keep the rule's 5/minute.
	other := &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", "7")}}
	if r := e.ask(t, other); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("no override: %v", r)
	}
}

func TestDetailedMetricKeepsTheTopValues(t *testing.T) {
	m := service.NewMetrics()
	rulesFile := "domain: m\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n"
	e := newEnv(t, service.Options{Metrics: m}, rulesFile)
	ask := func(v string) {
		e.ask(t, &rlsv3.RateLimitRequest{Domain: "m", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", v)}})
	}
	for range 50 {
		ask("heavy")
	}
	for i := range 3000 { // a flood of one-off values
		ask(fmt.Sprintf("flood%d", i))
	}
	for range 50 {
		ask("heavy")
	}
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series, heavy, other := 0, 0.0, 0.0
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_top_value_decisions" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			series++
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["outcome"] != "ok" {
				continue
			}
			switch {
			case strings.Contains(labels["value"], "heavy"):
				heavy = mt.GetGauge().GetValue()
			case labels["value"] == "other":
				other = mt.GetGauge().GetValue()
			}
		}
	}
	if series == 0 || series > 2*(100+1) {
		t.Fatalf("%d series, want at most 202 (100 values and other, two outcomes)", series)
	}
	if heavy < 50 || other < 2800 {
		t.Fatalf("heavy hitter %v, other %v", heavy, other)
	}
}

// An override replaces a sub-window rule's numbers even when its period is
// not a multiple of the rule's sub-windows.
func TestOverrideOnSubwindowRule(t *testing.T) {
	b, err := overrides.OpenBolt(t.TempDir() + "/o.db")
	if err != nil {
		t.Fatal(err)
	}
	cache := overrides.NewCache(b, 16, 0)
	t.Cleanup(func() { cache.Close() })
	file := "domain: s\ndescriptors:\n  - key: user\n    rate_limit:\n      algorithm: sliding_subwindow\n      window: 1h\n      granularity: 1m\n      requests_per_unit: 500\n"
	e := newEnv(t, service.Options{Overrides: cache}, file)
	m := e.svc.Rules().Match("s", []rules.Entry{{Key: "user", Value: "1"}})
	if err := cache.Put(context.Background(), overrides.Override{Domain: "s", Key: m.Key, Limit: 2, Period: 7 * time.Second}); err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "s", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", "1")}}
	for i := range 3 {
		r := e.ask(t, req)
		if want := i < 2; (r.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("request %d under a 2/7s override: %v", i, r)
		}
	}
}

// gatherSeries returns the values of the metric name's series, by their
// labels written name=value joined with ",", sorted by label name.
func gatherSeries(t *testing.T, m *service.Metrics, name string) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			var ls []string
			for _, l := range mt.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			v := mt.GetCounter().GetValue() + mt.GetGauge().GetValue()
			out[strings.Join(ls, ",")] = v
		}
	}
	return out
}

// A block-list limit (requests_per_unit 0) is counted in the decisions
// metric like any limit, in shadow mode too, so dry-running one shows
// what it would block.
func TestBlockedLimitIsCounted(t *testing.T) {
	m := service.NewMetrics()
	file := "domain: b\ndescriptors:\n  - key: ip\n    value: 10.0.0.1\n    rate_limit: {unit: second, requests_per_unit: 0, name: block}\n" +
		"  - key: ip\n    value: 10.0.0.2\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 0, name: dry}\n"
	e := newEnv(t, service.Options{Metrics: m}, file)
	for _, v := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.2"} {
		e.ask(t, &rlsv3.RateLimitRequest{Domain: "b", Descriptors: []*rlcommon.RateLimitDescriptor{d("ip", v)}})
	}
	e.ask(t, &rlsv3.RateLimitRequest{Domain: "b", HitsAddend: 0, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "ip", Value: "10.0.0.1"}}, HitsAddend: wrapperspb.UInt64(0)}}}) // a check
	got := gatherSeries(t, m, "floodgate_decisions_total")
	for series, want := range map[string]float64{
		"domain=b,outcome=over_limit,rule=block":      2,
		"domain=b,outcome=ok,rule=block":              1,
		"domain=b,outcome=shadow_over_limit,rule=dry": 1,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v (all: %v)", series, got[series], want, got)
		}
	}
}

// value_to_metric puts the request's value into the statistics key, and
// the per-value series show it (capped as detailed_metric's are).
func TestValueToMetricSeries(t *testing.T) {
	m := service.NewMetrics()
	file := "domain: v\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: method\n        rate_limit: {unit: second, requests_per_unit: 100}\n"
	e := newEnv(t, service.Options{Metrics: m}, file)
	for _, r := range []string{"r1", "r1", "r2"} {
		e.ask(t, &rlsv3.RateLimitRequest{Domain: "v", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "route", Value: r}, {Key: "method", Value: "GET"}}}}})
	}
	got := gatherSeries(t, m, "floodgate_top_value_decisions")
	if got["domain=v,outcome=ok,rule=v.route.method,value=v.route_r1.method"] != 2 ||
		got["domain=v,outcome=ok,rule=v.route.method,value=v.route_r2.method"] != 1 {
		t.Fatalf("per-value series: %v", got)
	}
}

// Label values are valid UTF-8 whatever the domain and the request's
// values hold: a label that is not made client_golang panic, which took
// the process down (a domain cut at 128 bytes inside a character) or
// failed every scrape (a long value's store key cut inside one).
func TestMetricLabelsStayUTF8(t *testing.T) {
	m := service.NewMetrics()
	domain := strings.Repeat("a", 127) + "é"
	file := "domain: " + domain + "\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n"
	e := newEnv(t, service.Options{Metrics: m}, file)
	for _, v := range []string{"a" + strings.Repeat("日", 1000), "b" + strings.Repeat("日", 1000), "c\xff\xfe", "c\xfe\xff"} {
		e.ask(t, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d("user", v)}})
	}
	got := gatherSeries(t, m, "floodgate_top_value_decisions") // fails on a bad label
	if len(got) == 0 {
		t.Fatal("no per-value series")
	}
	var total float64
	for series, v := range got {
		if !utf8.ValidString(series) {
			t.Errorf("label not UTF-8: %q", series)
		}
		if strings.Contains(series, "outcome=ok") {
			total += v
		}
	}
	if total != 4 {
		t.Errorf("the per-value series count %v decisions, want 4: %v", total, got)
	}
	if reqs := gatherSeries(t, m, "floodgate_requests_total"); reqs["code=ok,domain="+domain] != 4 {
		t.Errorf("requests: %v", reqs)
	}
}

// Decisions by a descriptor's own limit share one rule label: the limits
// are the caller's to choose, and a series per limit would let callers
// grow the metrics without bound.
func TestRequestLimitsShareOneSeries(t *testing.T) {
	m := service.NewMetrics()
	e := newEnv(t, service.Options{Metrics: m, AllowRequestLimits: true}, testRules)
	for n := uint32(11); n <= 15; n++ {
		own := d("unmatched", "v") // no rule: the own limit alone
		own.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_SECOND}
		e.ask(t, &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{own}})
	}
	got := gatherSeries(t, m, "floodgate_decisions_total")
	if len(got) != 1 || got["domain=t,outcome=ok,rule=_request_limit"] != 5 {
		t.Fatalf("series: %v", got)
	}
}

// A descriptor's own limit whose window overflows (a year times 300) is
// refused for what it is, not reported as a negative window.
func TestOwnLimitWindowTooLong(t *testing.T) {
	e := newEnv(t, service.Options{AllowRequestLimits: true}, testRules)
	own := d("user", "v")
	own.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR,
		UnitMultiplier: wrapperspb.UInt32(300)}
	_, err := e.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{own}})
	if err == nil || !strings.Contains(err.Error(), "unit_multiplier 300") || strings.Contains(err.Error(), "-") {
		t.Fatalf("%v", err)
	}
}

// Under all_or_nothing a refused request never holds the others' capacity,
// not even for a moment, on the memory store and on Redis: requests of one
// IP with users of their own (always admitted by them) race requests of
// that IP with a spent user (always refused), and the first kind gets
// exactly the IP's limit.
func TestAllOrNothingIsAtomic(t *testing.T) {
	for name, newStore := range bothStores {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, service.Options{Store: newStore(t)}, strings.ReplaceAll(aonRules, "requests_per_unit: 10", "requests_per_unit: 400"))
			e.ask(t, reqOf("aon", d("user", "spent")))
			var admitted, wrong atomic.Int64
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Go(func() {
					for i := range 100 {
						user := fmt.Sprintf("u%d-%d", w, i)
						if w%2 == 1 {
							user = "spent"
						}
						r, err := e.svc.ShouldRateLimit(context.Background(), reqOf("aon", d("ip", "1.2.3.4"), d("user", user)))
						switch {
						case err != nil:
							t.Error(err)
							return
						case r.OverallCode == rlsv3.RateLimitResponse_OK && user == "spent":
							wrong.Add(1)
						case r.OverallCode == rlsv3.RateLimitResponse_OK:
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if admitted.Load() != 400 || wrong.Load() != 0 {
				t.Fatalf("admitted %d of the 400 requests with users of their own (%d with the spent user): a refused request held the IP's capacity", admitted.Load(), wrong.Load())
			}
		})
	}
}
