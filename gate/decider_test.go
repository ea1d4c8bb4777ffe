package gate_test

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// parityRules is the rules file every front door's parity test uses.
var parityRules = func() string {
	b, err := os.ReadFile("../internal/decide/testdata/parity.yaml")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// mapOverrides is an overrides store in memory.
type mapOverrides map[string]overrides.Override

func (m mapOverrides) Get(ctx context.Context, domain, key string) (overrides.Override, bool, error) {
	o, ok := m[domain+"/"+key]
	return o, ok, nil
}
func (m mapOverrides) Put(context.Context, overrides.Override) error        { return nil }
func (m mapOverrides) Delete(context.Context, string, string) (bool, error) { return false, nil }
func (m mapOverrides) List(context.Context, string, string, int) ([]overrides.Override, error) {
	return nil, nil
}
func (m mapOverrides) Close() error { return nil }

// The gate answers a rules file's limits as the service does, each on a
// store of its own: quota_mode admits over the quota, replaces drops the
// replaced limit, an override gives a key its own numbers, and a value of
// any length is one key. (The gate ignored quota_mode, replaces and
// overrides.)
func TestGateAnswersAsService(t *testing.T) {
	d, err := rules.Parse("edge.yaml", []byte(parityRules))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	ovr := mapOverrides{"edge/api_key=vip-key": {Domain: "edge", Key: "api_key=vip-key", Limit: 5, Period: time.Hour}}
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limits, err := gate.FromRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Limits: limits, Rules: cfg, Clock: clk, Store: memstore.MustNew(memstore.Options{Clock: clk}), Overrides: overrides.Lookup(ovr)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	svc := service.New(cfg, service.Options{Store: memstore.MustNew(memstore.Options{Clock: clk}), Clock: clk, Overrides: ovr})

	viaGate := func(path, hdr, value string) bool {
		r := httptest.NewRequest("GET", "http://example.com"+path, nil)
		r.Header.Set(hdr, value)
		var v gate.Verdict
		g.Check(&gate.Request{HTTP: r, Peer: "192.0.2.1:1"}, &v)
		return v.Allowed
	}
	viaService := func(kv ...string) bool {
		req := &rlsv3.RateLimitRequest{Domain: "edge"}
		for i := 0; i+1 < len(kv); i += 2 {
			req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: kv[i], Value: kv[i+1]}}})
		}
		resp, err := svc.Decide(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK
	}
	long := strings.Repeat("k", 5000)
	for _, c := range []struct {
		what    string
		gate    func() bool
		service func() bool
		want    []bool
	}{
		{"quota_mode", func() bool { return viaGate("/quota/", "X-User", "ann") }, func() bool { return viaService("quota", "ann") }, []bool{true, true, true}},
		{"replaces", func() bool { return viaGate("/vip/", "X-User", "bob") }, func() bool { return viaService("user", "bob", "vip", "bob") }, []bool{true, true, true, false}},
		{"override", func() bool { return viaGate("/keyed/", "X-API-Key", "vip-key") }, func() bool { return viaService("api_key", "vip-key") }, []bool{true, true, true, true, true, false}},
		{"no override", func() bool { return viaGate("/keyed/", "X-API-Key", "other") }, func() bool { return viaService("api_key", "other") }, []bool{true, true, true, false}},
		{"a long value", func() bool { return viaGate("/keyed/", "X-API-Key", long) }, func() bool { return viaService("api_key", long) }, []bool{true, true, true, false}},
	} {
		for i, w := range c.want {
			if got := c.gate(); got != w {
				t.Errorf("%s, gate, request %d: allowed %v, want %v", c.what, i+1, got, w)
			}
			if got := c.service(); got != w {
				t.Errorf("%s, service, request %d: allowed %v, want %v", c.what, i+1, got, w)
			}
		}
	}
}

// The gate counts a rules-file limit's value under the service's store
// key, bounded as the service bounds it, whatever the value's length:
// serve and the proxy on one store share one counter.
func TestGateStoreKeyIsTheService(t *testing.T) {
	d, err := rules.Parse("edge.yaml", []byte(parityRules))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memstore.MustNew(memstore.Options{Clock: clk})
	limits, err := gate.FromRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Limits: limits, Rules: cfg, Clock: clk, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	svc := service.New(cfg, service.Options{Store: store, Clock: clk})
	for _, n := range []int{10, 300, 5000} {
		v := strings.Repeat("v", n)
		for i := range 4 {
			var allowed bool
			if i%2 == 0 {
				r := httptest.NewRequest("GET", "http://example.com/keyed/", nil)
				r.Header.Set("X-API-Key", v)
				var vd gate.Verdict
				g.Check(&gate.Request{HTTP: r, Peer: "192.0.2.1:1"}, &vd)
				allowed = vd.Allowed
			} else {
				resp, err := svc.Decide(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "api_key", Value: v}}}}})
				if err != nil {
					t.Fatal(err)
				}
				allowed = resp.OverallCode == rlsv3.RateLimitResponse_OK
			}
			if allowed != (i < 3) {
				t.Errorf("a value of %d bytes, request %d (gate %v): allowed %v", n, i+1, i%2 == 0, allowed)
			}
		}
		if m := cfg.Match("edge", []rules.Entry{{Key: "api_key", Value: v}}); n > decide.MaxKeyBytes && len(decide.StoreKey("edge", m.Key)) > len("edge")+1+decide.MaxKeyBytes {
			t.Errorf("a value of %d bytes: a store key of %d bytes", n, len(decide.StoreKey("edge", m.Key)))
		}
	}
}

// BenchmarkCheckRulesFile is a request through a rules-file limit (the
// decider's path), admitted, 1,000 keys.
func BenchmarkCheckRulesFile(b *testing.B) {
	d, err := rules.Parse("edge.yaml", []byte(parityRules))
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		b.Fatal(err)
	}
	limits, err := gate.FromRules(cfg)
	if err != nil {
		b.Fatal(err)
	}
	g, err := gate.New(gate.Config{Limits: limits, Rules: cfg})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	reqs := make([]*gate.Request, 1000)
	for i := range reqs {
		r := httptest.NewRequest("GET", "http://example.com/keyed/", nil)
		r.Header.Set("X-API-Key", "key-"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26%26)))
		reqs[i] = &gate.Request{HTTP: r, Peer: "192.0.2.1:1"}
	}
	var v gate.Verdict
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		*reqs[i%len(reqs)] = gate.Request{HTTP: reqs[i%len(reqs)].HTTP, Peer: "192.0.2.1:1"}
		g.Check(reqs[i%len(reqs)], &v)
	}
}
