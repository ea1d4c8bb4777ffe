// Package gate is the transport-neutral core of Floodgate's middleware:
// given the limits a service declares (which requests, keyed how, with
// which policy and what action over the limit), it decides a request —
// every matching limit, in one store call for all but requests matching
// dozens (see Config) — and reports what to answer.
// Packages httplimit and grpclimit put it in front of net/http handlers and
// grpc-go services; `floodgate proxy` puts it in front of any HTTP server.
//
// A gate decides on the in-process engine (the memory store, or Redis for
// a fleet), or asks a remote `floodgate serve` (or any Envoy rate limit
// service): see Remote, and package gate/remote for its gRPC client.
package gate

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/internal/decisiontrace"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

// Action is what a limit does to a request over it.
type Action uint8

// The actions.
const (
	// Deny refuses the request (HTTP 429 unless Limit.Status says
	// otherwise; gRPC RESOURCE_EXHAUSTED).
	Deny Action = iota
	// Ban refuses the request and, when the key goes over the ban
	// threshold, every request of the key for the rest of the threshold
	// interval and for the ban duration after it (Cloud Armor's
	// rate_based_ban).
	Ban
	// Delay queues the request until the limit frees a slot, up to
	// Limit.MaxDelay, and refuses it beyond (nginx's burst with delay).
	// It needs a bucket algorithm (token bucket, GCRA, leaky bucket).
	Delay
	// Redirect answers with a redirect to Limit.Redirect.
	Redirect
	// Shadow counts, logs and adds headers, and never refuses.
	Shadow
	// Defer refuses the request here, and the middleware queues it for
	// later: 202 Accepted with a location to poll, delivery at the
	// limit's rate by a worker (package deferq; httplimit.Options.Defer
	// names the queue of each Defer limit). It needs the limit's own
	// Policy, whose first rule's rate paces the deliveries.
	Defer
)

var actionNames = [...]string{"deny", "ban", "delay", "redirect", "shadow", "defer"}

// String returns the action's name, as rules files write it.
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "unknown"
}

// ParseAction reads an action's name.
func ParseAction(s string) (Action, error) {
	for i, n := range actionNames {
		if s == n {
			return Action(i), nil
		}
	}
	return 0, fmt.Errorf("unknown action %q (want deny, ban, delay, redirect, shadow or defer)", s)
}

// BanRule is a Ban action's threshold and duration: a key that sends more
// than Threshold requests within one Interval (fixed windows) is banned
// until the end of that interval plus Duration.
type BanRule struct {
	Threshold int64         // requests a key may send in one Interval, at least 1; the next one bans it
	Interval  time.Duration // the fixed window the requests are counted in, at least 1s
	Duration  time.Duration // how long a ban lasts after the end of its Interval, at least 1s
}

// DeferRule bounds a Defer action's queue; zero fields take package
// deferq's defaults.
type DeferRule struct {
	MaxQueue  int64         // requests queued and not yet delivered (beyond: 503)
	MaxBody   int64         // bytes of a queued body (beyond: 413)
	ResultTTL time.Duration // how long a delivered request's response is kept for polling
}

// DeferInterval is the gap between two deliveries of a Defer limit's
// queue: its policy's first rule's period over its limit (0 without a
// policy).
func (l *Limit) DeferInterval() time.Duration {
	if l.Policy == nil {
		return 0
	}
	rs := l.Policy.Rules()
	if len(rs) == 0 || rs[0].Limit <= 0 {
		return 0
	}
	return rs[0].Period / time.Duration(rs[0].Limit)
}

// Match selects the requests a limit applies to; every condition given
// must hold, and an empty Match selects every request.
type Match struct {
	// Hosts: exact names (case-insensitive, port ignored) or
	// "*.example.com" for any subdomain; an IPv6 address in brackets
	// ("[2001:db8::1]"), matched in any of its spellings.
	Hosts []string
	// PathPrefix: the path starts with it.
	PathPrefix string
	// Path: a pattern; "*" is one segment, a trailing "/**" any rest.
	// For gRPC the path is the full method, "/pkg.Service/Method".
	Path string
	// Methods: the HTTP methods (gRPC calls have none and never match a
	// Match with Methods).
	Methods []string
}

// A Limit is one limit the gate enforces.
type Limit struct {
	// Name names the limit in headers, logs and metrics; unique.
	Name string
	// Policy is the limit's rules, for the in-process engine. With
	// Domain set instead, the policy comes from the rules of that domain
	// (Config.Rules), matched by the key's descriptor entries; with
	// Config.Remote, the remote service's rules decide.
	Policy *floodgate.Policy
	// Domain, instead of Policy, names a domain of Config.Rules: the
	// limit's policy is that of the descriptor its key's entries match.
	Domain string
	// Match selects the requests the limit applies to.
	Match Match
	// Key is the limit's key: the parts joined (an empty Key is All).
	Key []Part
	// Cost is what one request consumes (default 1).
	Cost int64
	// Action over the limit (default Deny).
	Action Action
	// Status is the HTTP status of a refusal (default 429).
	Status int
	// MaxDelay bounds a Delay action's wait.
	MaxDelay time.Duration
	// Redirect is a Redirect action's target URL.
	Redirect       string
	RedirectStatus int // a Redirect action's status: 301, 302 (the default), 303, 307 or 308
	// Ban is a Ban action's threshold.
	Ban BanRule
	// Defer is a Defer action's queue bounds.
	Defer DeferRule
	// ExemptKeys are keys (the parts' values joined by '|') never limited.
	ExemptKeys []string
	// ExemptNets are client networks never limited.
	ExemptNets []netip.Prefix
	// Blocked refuses every request the limit applies to, without asking
	// the store (envoyproxy/ratelimit's requests_per_unit: 0).
	Blocked bool
	// Criticality, if set, is the most a request the limit's Match
	// applies to may claim with the server throttler (one of
	// Criticalities; see Classify): its level when it claims none, the
	// ceiling of one it claims unless it comes from a trusted proxy.
	Criticality string

	blockedPolicy *floodgate.Policy // a blocked rules-file route's placeholder, for its window
}

// Config configures a Gate.
//
// A gate takes any number of limits: it finds a request's limits by host
// and leading path segments rather than trying each, so a gate of
// thousands of them (one per API endpoint, per tenant host) costs a
// request about what a gate of a few does. Rules files bound what they
// declare (rules.MaxRoutes routes a file).
//
// A request's limits are decided together, all or nothing: one refused
// means none consumes. They go to the store in one call of at most 48
// operations (a limit takes one, a Ban limit three: at least 16 limits),
// which on the memory store and on one Redis server is one atomic step
// (floodgate.DoGroup). A request matching more is decided in as many
// calls as it needs, in configuration order, every limit enforced; each
// call is atomic, and across calls all or nothing is kept by giving back
// what the earlier calls took when a later one refuses, so that
// meanwhile a concurrent request may see that capacity taken. The gate
// logs the first such request. With Remote, each call carries at most 48
// descriptors (floodgate serve takes 64), and the service's all or
// nothing holds within each call.
type Config struct {
	// Limits are the limits the gate enforces, in order; their Names are
	// unique.
	Limits []Limit
	// Store keeps the limits' state (default: a new in-memory store).
	Store floodgate.Store
	// Clock is the gate's time (default clock.Coarse).
	Clock floodgate.Clock
	// ClientIP finds and groups client addresses.
	ClientIP ClientIP
	// Rules resolves limits that name a Domain.
	Rules *rules.Config
	// Overrides gives keys of a Rules domain their own limits, as it does
	// in floodgate serve (overrides.Lookup adapts an overrides.Store); nil:
	// none.
	Overrides rules.Overrides
	// Remote, when set, asks a rate limit service instead of the store
	// (gate/remote.New). Ban and Delay actions need the local engine.
	Remote Remote
	// User returns the authenticated user for the User part (default:
	// what WithUser stored).
	User func(ctx context.Context) (string, bool)
	// Route returns an HTTP request's route pattern for the Route part
	// (default: Request.Pattern, set by net/http's ServeMux for handlers
	// it routed to, else the path).
	Route func(r *http.Request) string
	// FailClosed refuses requests when the store (or remote service)
	// fails outright; by default they pass. Rules on Redis have their own
	// failure modes, which decide first (see floodgate.Rule).
	FailClosed bool
	// Logger receives shadow-mode refusals and store failures (at most one
	// line a second); default slog.Default().
	Logger *slog.Logger
	// TracerProvider, when set, traces each request a limit applies to in
	// a span, "floodgate.gate", continuing the request's trace (a span in
	// its context, else W3C traceparent in its headers or gRPC metadata):
	// the limits' names, a hash of each key (never the key), the outcome
	// and the store's latency (docs/MIDDLEWARE.md "Traces"). nil: off, at
	// no cost.
	TracerProvider trace.TracerProvider
}

// Gate decides requests against a set of limits. It is safe for
// concurrent use.
type Gate struct {
	cfg     Config
	limits  []*limit
	index   *routeIndex // nil: try every limit
	store   floodgate.Store
	clock   floodgate.Clock
	ownsMem *memstore.Store
	dec     *decide.Decider // a rules file's limits
	lastLog atomic.Int64
	split   atomic.Bool           // a request's limits took several calls (logged once)
	tracer  *decisiontrace.Tracer // nil: off
}

// limit is a Limit compiled.
type limit struct {
	*Limit
	parts       []compiledPart
	hosts       []string // lower-cased
	pathSegs    []string
	pathRest    bool
	methods     []string
	exempt      map[string]bool
	sfName      string
	policyItem  []string // RateLimit-Policy of the Policy alone, shared (len == cap)
	policyItems []string // its items, one per rule
	ruleNames   map[string]string
	banMarker   *floodgate.Policy
	banThresh   *floodgate.Policy
	banBurst    int64
	blockedLm   *rules.Limit // a Blocked limit's
}

// maxOps bounds the operations of one store call (a Ban limit takes
// three, any other one), and the descriptors of one call to a Remote
// service: a request needing more is decided in several calls (see
// Config). The stores take any number (the memory store's batches and
// groups, and Redis's BatchFunction, are unbounded), but Redis runs a call
// alone, its coalescer sends 64 decisions a call by default, and floodgate
// serve takes 64 descriptors a request: 48 keeps one request's call within
// those.
const maxOps = 48

// maxKeyParts bounds the parts of a limit's key.
const maxKeyParts = 8

// banGrain is the granularity of a ban's duration.
const banGrain = 10 * time.Millisecond

// New compiles cfg into a gate; it reports the first bad limit by index
// and field.
func New(cfg Config) (*Gate, error) {
	g := &Gate{cfg: cfg, store: cfg.Store, clock: cfg.Clock}
	if g.clock == nil {
		g.clock = clock.Coarse
	}
	if g.cfg.Logger == nil {
		g.cfg.Logger = slog.Default()
	}
	g.cfg.ClientIP.normalize()
	g.dec = decide.New(decide.Options{Overrides: cfg.Overrides, Logger: g.cfg.Logger})
	g.tracer = decisiontrace.New(cfg.TracerProvider, "floodgate.gate", trace.SpanKindInternal)
	if g.store == nil && cfg.Remote == nil {
		ms, err := memstore.New(memstore.Options{Clock: g.clock})
		if err != nil {
			return nil, err
		}
		g.store, g.ownsMem = ms, ms
	}
	names := make(map[string]bool, len(cfg.Limits))
	for i := range cfg.Limits {
		l, err := g.compile(&cfg.Limits[i])
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("gate: limits[%d] (%s): %w", i, cfg.Limits[i].Name, err)
		}
		if names[l.Name] {
			g.Close()
			return nil, fmt.Errorf("gate: limits[%d]: name %q used twice", i, l.Name)
		}
		names[l.Name] = true
		g.limits = append(g.limits, l)
	}
	if len(g.limits) >= indexMin {
		g.index = newRouteIndex(g.limits)
	}
	return g, nil
}

// Close releases the in-memory store the gate made for itself.
func (g *Gate) Close() {
	if g.ownsMem != nil {
		g.ownsMem.Close()
	}
}

// logf logs at most one line a second.
func (g *Gate) logf(msg, k string, v any) {
	now := time.Now().UnixNano()
	last := g.lastLog.Load()
	if now-last < int64(time.Second) || !g.lastLog.CompareAndSwap(last, now) {
		return
	}
	g.cfg.Logger.Warn(msg, k, v)
}

// Lift ends a ban on key under the named limit; the key's counts are
// forgotten too, so it starts afresh.
func (g *Gate) Lift(ctx context.Context, limitName, key string) error {
	for _, l := range g.limits {
		if l.Name != limitName {
			continue
		}
		if l.banMarker == nil {
			return fmt.Errorf("gate: limit %q has no ban", limitName)
		}
		now := g.clock.NowMicro()
		ops := []floodgate.Op{
			{Policy: l.banMarker, Key: key, Kind: floodgate.OpReset},
			{Policy: l.banThresh, Key: key, Kind: floodgate.OpReset},
		}
		return g.store.DoBatch(ctx, now, ops, make([]floodgate.Decision, len(ops)))
	}
	return fmt.Errorf("gate: no limit %q", limitName)
}

// Limits returns the gate's limits.
func (g *Gate) Limits() []Limit {
	out := make([]Limit, len(g.limits))
	for i, l := range g.limits {
		out[i] = *l.Limit
	}
	return out
}
