package envoy_test

// Envoy is not run here (nor installed): envoy.yaml is parsed into Envoy's
// own config types (go-control-plane) and checked with Envoy's validation
// rules (protoc-gen-validate), and the descriptors its rate_limits build are
// computed by a short emulation of those actions, then decided by
// Floodgate's service with the example rules.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// The typed_config types envoy.yaml uses. Importing their packages registers
// them, so that protojson resolves each "@type" (an unregistered one fails
// the parse).
var _ = []proto.Message{
	&hcmv3.HttpConnectionManager{},
	&ratelimitv3.RateLimit{},
	&routerv3.Router{},
	&upstreamhttpv3.HttpProtocolOptions{},
}

const (
	envoyFile  = "envoy.yaml"
	rulesDir   = "rules"
	floodgate  = "floodgate" // the cluster the ratelimit filter calls
	grpcPort   = 8081        // floodgate serve's default --grpc-addr port
	hcmName    = "envoy.filters.network.http_connection_manager"
	filterName = "envoy.filters.http.ratelimit"
)

// envoyConfig is the parts of envoy.yaml the tests look at.
type envoyConfig struct {
	bootstrap *bootstrapv3.Bootstrap
	filter    *ratelimitv3.RateLimit // the ratelimit filter's config
	routes    []*routev3.Route       // the routes of the listener's one virtual host
	clusters  map[string]*clusterv3.Cluster
	hcm       *hcmv3.HttpConnectionManager
}

// yamlToJSON converts YAML to JSON, for protojson (Envoy reads its YAML the
// same way: YAML to JSON to proto).
func yamlToJSON(t *testing.T, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return js
}

// validateTree runs Envoy's validation rules on m and, since those stop at
// a google.protobuf.Any, on every typed_config inside it, unpacked.
func validateTree(m proto.Message, at string) []error {
	var errs []error
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, err))
		}
	} else {
		errs = append(errs, fmt.Errorf("%s: %T has no validation rules", at, m))
	}
	eachAny(m.ProtoReflect(), at, func(a *anypb.Any, where string) {
		inner, err := a.UnmarshalNew()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", where, a.GetTypeUrl(), err))
			return
		}
		errs = append(errs, validateTree(inner, where+"<"+string(inner.ProtoReflect().Descriptor().Name())+">")...)
	})
	return errs
}

// eachAny calls fn with every Any set in m, not looking inside them.
func eachAny(m protoreflect.Message, at string, fn func(*anypb.Any, string)) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		fn(a, at)
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := at + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					eachAny(mv.Message(), fmt.Sprintf("%s[%s]", name, k.String()), fn)
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i, l := 0, v.List(); i < l.Len(); i++ {
					eachAny(l.Get(i).Message(), fmt.Sprintf("%s[%d]", name, i), fn)
				}
			}
		case fd.Message() != nil:
			eachAny(v.Message(), name, fn)
		}
		return true
	})
}

// unpack unpacks a typed_config into out, failing unless it is out's type.
func unpack(t *testing.T, a *anypb.Any, out proto.Message, what string) {
	t.Helper()
	if a == nil {
		t.Fatalf("%s: no typed_config", what)
	}
	if err := a.UnmarshalTo(out); err != nil {
		t.Fatalf("%s: typed_config %s: %v", what, a.GetTypeUrl(), err)
	}
}

// loadEnvoy parses and validates envoy.yaml and finds its parts.
func loadEnvoy(t *testing.T) *envoyConfig {
	t.Helper()
	b := &bootstrapv3.Bootstrap{}
	// Unknown fields are errors, as they are to Envoy.
	if err := protojson.Unmarshal(yamlToJSON(t, envoyFile), b); err != nil {
		t.Fatalf("%s: not an Envoy v3 bootstrap: %v", envoyFile, err)
	}
	if errs := validateTree(b, "bootstrap"); len(errs) > 0 {
		for _, err := range errs {
			t.Error(err)
		}
		t.FailNow()
	}

	c := &envoyConfig{bootstrap: b, clusters: map[string]*clusterv3.Cluster{}}
	sr := b.GetStaticResources()
	for _, cl := range sr.GetClusters() {
		if c.clusters[cl.GetName()] != nil {
			t.Fatalf("two clusters named %q", cl.GetName())
		}
		c.clusters[cl.GetName()] = cl
	}
	if len(sr.GetListeners()) != 1 || len(sr.GetListeners()[0].GetFilterChains()) != 1 {
		t.Fatalf("want one listener with one filter chain")
	}
	for _, f := range sr.GetListeners()[0].GetFilterChains()[0].GetFilters() {
		if f.GetName() == hcmName {
			c.hcm = &hcmv3.HttpConnectionManager{}
			unpack(t, f.GetTypedConfig(), c.hcm, f.GetName())
		}
	}
	if c.hcm == nil {
		t.Fatalf("no %s in the listener", hcmName)
	}
	vhosts := c.hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhosts) != 1 {
		t.Fatalf("want an inline route_config with one virtual host, have %d", len(vhosts))
	}
	c.routes = vhosts[0].GetRoutes()
	for _, f := range c.hcm.GetHttpFilters() {
		if f.GetName() == filterName {
			c.filter = &ratelimitv3.RateLimit{}
			unpack(t, f.GetTypedConfig(), c.filter, f.GetName())
		}
	}
	if c.filter == nil {
		t.Fatalf("no %s in the HTTP filters", filterName)
	}
	return c
}

// TestEnvoyConfig checks envoy.yaml as Envoy would load it: the v3 types
// with their validation rules (in loadEnvoy), then what Envoy checks beyond
// them and what calling Floodgate needs.
func TestEnvoyConfig(t *testing.T) {
	c := loadEnvoy(t)

	// The ratelimit filter comes before the router, which is last.
	filters := c.hcm.GetHttpFilters()
	rl, router := -1, -1
	for i, f := range filters {
		switch f.GetTypedConfig().MessageName() {
		case "envoy.extensions.filters.http.ratelimit.v3.RateLimit":
			rl = i
		case "envoy.extensions.filters.http.router.v3.Router":
			router = i
		}
	}
	if router != len(filters)-1 || rl < 0 || rl > router {
		t.Errorf("HTTP filters: want the ratelimit filter before the router, the router last: ratelimit at %d, router at %d of %d", rl, router, len(filters))
	}

	// The filter: the rules' domain, fail open, a timeout, gRPC v3 to the
	// floodgate cluster.
	f := c.filter
	if f.GetDomain() == "" || f.GetFailureModeDeny() || f.GetTimeout().AsDuration() <= 0 || f.GetStage() != 0 {
		t.Errorf("ratelimit filter: domain %q, failure_mode_deny %v, timeout %v, stage %d", f.GetDomain(), f.GetFailureModeDeny(), f.GetTimeout().AsDuration(), f.GetStage())
	}
	rls := f.GetRateLimitService()
	if rls.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("rate_limit_service.transport_api_version = %v, want V3 (Floodgate serves envoy.service.ratelimit.v3)", rls.GetTransportApiVersion())
	}
	if got := rls.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != floodgate {
		t.Errorf("rate_limit_service cluster %q, want %q", got, floodgate)
	}

	// The floodgate cluster speaks HTTP/2 (gRPC) to floodgate serve's port.
	cl := c.clusters[floodgate]
	if cl == nil {
		t.Fatalf("no cluster %q", floodgate)
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	unpack(t, cl.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], opts, "cluster floodgate protocol options")
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %q: want explicit_http_config.http2_protocol_options (gRPC needs HTTP/2)", floodgate)
	}
	var ports []uint32
	for _, eps := range cl.GetLoadAssignment().GetEndpoints() {
		for _, ep := range eps.GetLbEndpoints() {
			ports = append(ports, ep.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue())
		}
	}
	if !reflect.DeepEqual(ports, []uint32{grpcPort}) {
		t.Errorf("cluster %q endpoints' ports %v, want [%d] (floodgate serve's gRPC port)", floodgate, ports, grpcPort)
	}

	// Every cluster a route names exists (Envoy refuses the config
	// otherwise), and the routes have rate limits.
	for _, r := range c.routes {
		if name := r.GetRoute().GetCluster(); c.clusters[name] == nil {
			t.Errorf("route %v: no cluster %q", r.GetMatch(), name)
		}
		if len(r.GetRoute().GetRateLimits()) == 0 {
			t.Errorf("route %v: no rate_limits", r.GetMatch())
		}
	}
}

// TestRulesLoad loads rules/ as `floodgate validate` and `floodgate serve
// --rules` do: a broken example fails here.
func TestRulesLoad(t *testing.T) {
	cfg := loadRules(t)
	c := loadEnvoy(t)
	if cfg.Domain(c.filter.GetDomain()) == nil {
		t.Fatalf("the ratelimit filter's domain %q is in no rules file", c.filter.GetDomain())
	}
}

func loadRules(t *testing.T) *rules.Config {
	t.Helper()
	cfg, errs := rules.LoadDir(rulesDir)
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return cfg
}

// request is what the emulated actions read: the client's address and the
// request's headers, names in lower case, pseudo-headers (":path")
// included.
type request struct {
	ip      string
	headers map[string]string
}

func get(ip, path string, headers ...string) request {
	r := request{ip: ip, headers: map[string]string{":method": "GET", ":path": path}}
	for i := 0; i+1 < len(headers); i += 2 {
		r.headers[strings.ToLower(headers[i])] = headers[i+1]
	}
	return r
}

// pickRoute emulates Envoy's route matching for the prefix routes used:
// the first route whose prefix starts the path (the query included, as
// Envoy's prefix match does).
func pickRoute(t *testing.T, routes []*routev3.Route, req request) *routev3.Route {
	t.Helper()
	for _, r := range routes {
		p, ok := r.GetMatch().GetPathSpecifier().(*routev3.RouteMatch_Prefix)
		if !ok || len(r.GetMatch().GetHeaders()) > 0 || r.GetMatch().GetQueryParameters() != nil {
			t.Fatalf("route %v: the emulation handles prefix matches only", r.GetMatch())
		}
		if strings.HasPrefix(req.headers[":path"], p.Prefix) {
			return r
		}
	}
	return nil
}

// descriptors emulates how Envoy (source/common/router/router_ratelimit.cc)
// builds the descriptors of a request from a route's rate_limits, for the
// actions envoy.yaml uses. Each rate_limits entry of the filter's stage
// gives at most one descriptor: its actions in order, each appending one
// entry or, failing, dropping the whole descriptor:
//
//   - remote_address: ("remote_address", the client's IP address).
//   - request_headers: (descriptor_key, the header's first value); a missing
//     header drops the descriptor (with skip_if_absent: adds no entry).
//   - generic_key: (descriptor_key or "generic_key", descriptor_value).
//   - header_value_match: (descriptor_key or "header_match",
//     descriptor_value) when the headers match as expect_match (default
//     true) says; otherwise drops the descriptor.
//
// Any other action, or matcher, fails the test rather than be guessed at.
func descriptors(t *testing.T, limits []*routev3.RateLimit, stage uint32, req request) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	var out []*rlcommon.RateLimitDescriptor
next:
	for _, rl := range limits {
		if rl.GetStage().GetValue() != stage {
			continue
		}
		if rl.GetDisableKey() != "" || rl.GetLimit() != nil || rl.GetApplyOnStreamDone() {
			t.Fatalf("rate_limits %v: the emulation handles no disable_key, limit or apply_on_stream_done", rl)
		}
		d := &rlcommon.RateLimitDescriptor{}
		add := func(k, v string) {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		for _, a := range rl.GetActions() {
			switch a := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RemoteAddress_:
				add("remote_address", req.ip)
			case *routev3.RateLimit_Action_RequestHeaders_:
				v, ok := req.headers[strings.ToLower(a.RequestHeaders.GetHeaderName())]
				switch {
				case ok:
					add(a.RequestHeaders.GetDescriptorKey(), v)
				case !a.RequestHeaders.GetSkipIfAbsent():
					continue next
				}
			case *routev3.RateLimit_Action_GenericKey_:
				add(or(a.GenericKey.GetDescriptorKey(), "generic_key"), a.GenericKey.GetDescriptorValue())
			case *routev3.RateLimit_Action_HeaderValueMatch_:
				hv := a.HeaderValueMatch
				expect := hv.GetExpectMatch() == nil || hv.GetExpectMatch().GetValue()
				if headersMatch(t, hv.GetHeaders(), req) != expect {
					continue next
				}
				add(or(hv.GetDescriptorKey(), "header_match"), hv.GetDescriptorValue())
			default:
				t.Fatalf("rate_limits action %T: not emulated", a)
			}
		}
		out = append(out, d) // as Envoy: even with no entries (see docs/SERVICE.md)
	}
	return out
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// headersMatch emulates Envoy's header matchers for string_match exact and
// prefix (case-sensitive, not inverted): all must match.
func headersMatch(t *testing.T, ms []*routev3.HeaderMatcher, req request) bool {
	t.Helper()
	for _, m := range ms {
		sm := m.GetStringMatch()
		if sm == nil || sm.GetIgnoreCase() || m.GetInvertMatch() || m.GetTreatMissingHeaderAsEmpty() {
			t.Fatalf("header matcher %v: the emulation handles string_match exact and prefix only", m)
		}
		v, ok := req.headers[strings.ToLower(m.GetName())]
		if !ok {
			return false
		}
		switch {
		case sm.GetExact() != "":
			ok = v == sm.GetExact()
		case sm.GetPrefix() != "":
			ok = strings.HasPrefix(v, sm.GetPrefix())
		default:
			t.Fatalf("header matcher %v: the emulation handles string_match exact and prefix only", m)
		}
		if !ok {
			return false
		}
	}
	return true
}

// edge is envoy.yaml and the rules, with a Floodgate service on the memory
// store and a clock the test moves.
type edge struct {
	env *envoyConfig
	cfg *rules.Config
	svc *service.Service
	clk *clock.Manual
}

func newEdge(t *testing.T) *edge {
	t.Helper()
	e := &edge{env: loadEnvoy(t), cfg: loadRules(t)}
	// A second's start: the per-second fixed windows begin here.
	e.clk = clock.NewManual(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	st := memstore.MustNew(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	e.svc = service.New(e.cfg, service.Options{Store: st, Clock: e.clk})
	return e
}

// envoyRequest is the RateLimitRequest Envoy's filter sends for req: its
// domain and the matched route's descriptors; nil when Envoy would not
// call (no descriptors).
func (e *edge) envoyRequest(t *testing.T, req request) *rlsv3.RateLimitRequest {
	t.Helper()
	r := pickRoute(t, e.env.routes, req)
	if r == nil {
		return nil
	}
	ds := descriptors(t, r.GetRoute().GetRateLimits(), e.env.filter.GetStage(), req)
	if len(ds) == 0 {
		return nil
	}
	return &rlsv3.RateLimitRequest{Domain: e.env.filter.GetDomain(), Descriptors: ds}
}

// send is one request through Envoy and Floodgate.
func (e *edge) send(t *testing.T, req request) *rlsv3.RateLimitResponse {
	t.Helper()
	rr := e.envoyRequest(t, req)
	if rr == nil {
		t.Fatalf("%v: Envoy would not call Floodgate", req)
	}
	resp, err := e.svc.ShouldRateLimit(context.Background(), rr)
	if err != nil {
		t.Fatalf("%v: %v", req, err)
	}
	return resp
}

func (e *edge) allowed(t *testing.T, req request) bool {
	t.Helper()
	return e.send(t, req).GetOverallCode() == rlsv3.RateLimitResponse_OK
}

// entries writes a request's descriptors as "k=v,k=v" each.
func entries(rr *rlsv3.RateLimitRequest) []string {
	var out []string
	for _, d := range rr.GetDescriptors() {
		var kv []string
		for _, e := range d.GetEntries() {
			kv = append(kv, e.GetKey()+"="+e.GetValue())
		}
		out = append(out, strings.Join(kv, ","))
	}
	return out
}

// TestEnvoyDescriptors shows the descriptors envoy.yaml's actions build for
// sample requests, and that the rules give each a limit.
func TestEnvoyDescriptors(t *testing.T) {
	e := newEdge(t)
	for _, tc := range []struct {
		name string
		req  request
		want []string
	}{
		{"anonymous", get("192.0.2.7", "/"),
			[]string{"remote_address=192.0.2.7", "generic_key=app"}},
		{"api key", get("192.0.2.7", "/v1/orders", "X-API-Key", "k1"),
			[]string{"remote_address=192.0.2.7", "api_key=k1", "generic_key=app"}},
		{"api key, search", get("2001:db8::1", "/v1/search?q=x", "X-API-Key", "k1"),
			[]string{"remote_address=2001:db8::1", "api_key=k1", "api_key=k1,endpoint=search", "generic_key=app"}},
		{"search without a key", get("192.0.2.7", "/v1/search"),
			[]string{"remote_address=192.0.2.7", "generic_key=app"}},
	} {
		rr := e.envoyRequest(t, tc.req)
		if got := entries(rr); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Envoy sends %q, want %q", tc.name, got, tc.want)
		}
		for _, d := range rr.GetDescriptors() {
			var es []rules.Entry
			for _, en := range d.GetEntries() {
				es = append(es, rules.Entry{Key: en.GetKey(), Value: en.GetValue()})
			}
			if m := e.cfg.Match(rr.GetDomain(), es); m == nil || m.Limit == nil {
				t.Errorf("%s: descriptor %v matches no limit in %s", tc.name, es, rulesDir)
			}
		}
	}
}

// TestEnvoyLimits sends requests through the emulated Envoy to Floodgate
// and checks each limit of the rules holds, and only where it should.
func TestEnvoyLimits(t *testing.T) {
	// The n-th address of a /16, a client of its own.
	ip := func(n int) string { return fmt.Sprintf("10.1.%d.%d", n/250, n%250+1) }

	t.Run("per address", func(t *testing.T) {
		e := newEdge(t)
		for i := range 20 {
			if !e.allowed(t, get("192.0.2.7", "/")) {
				t.Fatalf("request %d of 20 in a second refused", i+1)
			}
		}
		over := e.send(t, get("192.0.2.7", "/"))
		if over.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("the 21st request in a second: %v", over.GetOverallCode())
		}
		// Floodgate's headers, which Envoy's filter adds to its 429.
		if h := header(over, "Retry-After"); h == "" {
			t.Errorf("over the limit: no Retry-After in %v", over.GetResponseHeadersToAdd())
		}
		if !e.allowed(t, get("192.0.2.8", "/")) {
			t.Error("another address refused")
		}
		e.clk.Advance(time.Second)
		if !e.allowed(t, get("192.0.2.7", "/")) {
			t.Error("refused in the next second")
		}
	})

	t.Run("per API key", func(t *testing.T) {
		e := newEdge(t)
		// 60 a minute, each from its own address (20 a second each allowed).
		for i := range 60 {
			if !e.allowed(t, get(ip(i), "/v1/orders", "X-API-Key", "k1")) {
				t.Fatalf("request %d of 60 in a minute refused", i+1)
			}
		}
		over := e.send(t, get(ip(60), "/v1/orders", "X-API-Key", "k1"))
		if over.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("the 61st request of key k1 in a minute: %v", over.GetOverallCode())
		}
		// Only the api_key descriptor (the second) is over.
		for i, st := range over.GetStatuses() {
			want := rlsv3.RateLimitResponse_OK
			if i == 1 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if st.GetCode() != want {
				t.Errorf("descriptor %d: %v, want %v", i, st.GetCode(), want)
			}
		}
		if !e.allowed(t, get(ip(61), "/v1/orders", "X-API-Key", "k2")) {
			t.Error("another key refused")
		}
		if !e.allowed(t, get(ip(62), "/v1/orders")) {
			t.Error("a request without a key refused")
		}
		// A sliding window (the extension): half a minute later, the
		// previous minute's 60 still weigh half.
		e.clk.Advance(90 * time.Second)
		for i := range 30 {
			if !e.allowed(t, get(ip(100+i), "/v1/orders", "X-API-Key", "k1")) {
				t.Fatalf("90s later, request %d of 30 refused", i+1)
			}
		}
		if e.allowed(t, get(ip(130), "/v1/orders", "X-API-Key", "k1")) {
			t.Error("90s later, a 31st request admitted: the sliding window forgot the previous minute")
		}
	})

	t.Run("search per API key", func(t *testing.T) {
		e := newEdge(t)
		for i := range 10 {
			if !e.allowed(t, get(ip(i), "/v1/search?q=x", "X-API-Key", "k1")) {
				t.Fatalf("search %d of 10 in a minute refused", i+1)
			}
		}
		if e.allowed(t, get(ip(10), "/v1/search?q=y", "X-API-Key", "k1")) {
			t.Fatal("the 11th search of key k1 in a minute admitted")
		}
		if !e.allowed(t, get(ip(11), "/v1/orders", "X-API-Key", "k1")) {
			t.Error("k1's other requests refused after its searches ran out")
		}
		if !e.allowed(t, get(ip(12), "/v1/search", "X-API-Key", "k2")) {
			t.Error("another key's search refused")
		}
	})

	t.Run("whole route", func(t *testing.T) {
		e := newEdge(t)
		for i := range 500 {
			if !e.allowed(t, get(ip(i), "/")) {
				t.Fatalf("request %d of 500 in a second refused", i+1)
			}
		}
		over := e.send(t, get(ip(500), "/"))
		if over.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || over.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("the 501st request in a second, from a new address: %v", over.GetStatuses())
		}
		e.clk.Advance(time.Second)
		if !e.allowed(t, get(ip(501), "/")) {
			t.Error("refused in the next second")
		}
	})

	t.Run("headers", func(t *testing.T) {
		e := newEdge(t)
		ok := e.send(t, get("192.0.2.7", "/v1/orders", "X-API-Key", "k1"))
		// Envoy's filter adds these to the response the client gets.
		for _, name := range []string{"RateLimit", "RateLimit-Policy"} {
			if header(ok, name) == "" {
				t.Errorf("no %s header in %v", name, ok.GetResponseHeadersToAdd())
			}
		}
		// Envoy builds its X-RateLimit-* headers from each status's
		// current_limit, limit_remaining and duration_until_reset.
		for i, st := range ok.GetStatuses() {
			if st.GetCurrentLimit() == nil || st.GetCurrentLimit().GetRequestsPerUnit() == 0 {
				t.Errorf("descriptor %d: no current_limit: %v", i, st)
			}
		}
	})
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}
