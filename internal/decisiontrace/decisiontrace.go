// Package decisiontrace makes OpenTelemetry spans of rate-limit decisions
// for the service (floodgate serve) and the gate (the middleware, the
// proxy): one span per decision, continuing the caller's trace, with the
// domain, the deciding rules, a keyed hash of each key (never the key),
// the outcome and the store's latency.
//
// A nil *Tracer is off: callers test for nil before doing anything, so
// tracing costs nothing (no allocation, no clock read) when no
// TracerProvider was given.
package decisiontrace

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/dchest/siphash"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The span's attributes.
const (
	AttrDomain       = "floodgate.domain"           // the rules' domain ("" for the gate's limits in Go)
	AttrRules        = "floodgate.rules"            // the deciding limits' names, one per decided key
	AttrKeyHashes    = "floodgate.key_hashes"       // KeyHash of each key, in the order of AttrRules
	AttrOutcome      = "floodgate.outcome"          // one of the Outcome values
	AttrAllowed      = "floodgate.allowed"          // whether the request may proceed
	AttrStoreLatency = "floodgate.store.latency_us" // time in the store's calls, in microseconds
)

// Outcomes, the value of AttrOutcome. One is said: degraded if a failure
// mode decided (the store could not), else refused, shadow (a shadow limit
// would have refused), warned (let past a soft limit), allowed.
const (
	Allowed  = "allowed"
	Refused  = "refused"
	Shadow   = "shadow"
	Degraded = "degraded"
	Warned   = "warned"
)

// MaxKeys bounds the rules and key hashes a span lists: a request of many
// descriptors gets its first MaxKeys.
const MaxKeys = 16

// ScopeName is the instrumentation scope of Floodgate's tracer.
const ScopeName = "github.com/floodgate/floodgate"

// Tracer starts decision spans. The zero of *Tracer, nil, is off.
type Tracer struct {
	t    trace.Tracer
	prop propagation.TextMapPropagator
	kind trace.SpanKind
	name string
}

// New returns a tracer of tp's spans named name, of kind (Server for the
// service's RPC, Internal for a middleware's part of a request), or nil
// (off) when tp is nil.
func New(tp trace.TracerProvider, name string, kind trace.SpanKind) *Tracer {
	if tp == nil {
		return nil
	}
	return &Tracer{t: tp.Tracer(ScopeName), prop: propagation.TraceContext{}, kind: kind, name: name}
}

// Start starts a decision's span. When ctx holds no span, the W3C trace
// context in carrier (traceparent, tracestate), if any, is its parent: the
// span continues the caller's trace. carrier may be nil.
func (t *Tracer) Start(ctx context.Context, carrier propagation.TextMapCarrier) (context.Context, trace.Span) {
	if carrier != nil && !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = t.prop.Extract(ctx, carrier)
	}
	return t.t.Start(ctx, t.name, trace.WithSpanKind(t.kind))
}

// Decision is what a span says of a decision.
type Decision struct {
	Domain       string
	Rules        []string // deciding limits' names (at most MaxKeys are kept)
	KeyHashes    []string // KeyHash of each key, as Rules
	Outcome      string
	Allowed      bool
	StoreLatency time.Duration
}

// Add records a decided key: its rule's name and its key's hash.
func (d *Decision) Add(rule, key string) {
	if len(d.Rules) < MaxKeys {
		d.Rules = append(d.Rules, rule)
		d.KeyHashes = append(d.KeyHashes, KeyHash(key))
	}
}

// End sets d's attributes on span (and an error status when err is not
// nil) and ends it.
func End(span trace.Span, d *Decision, err error) {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String(AttrDomain, d.Domain),
			attribute.StringSlice(AttrRules, d.Rules),
			attribute.StringSlice(AttrKeyHashes, d.KeyHashes),
			attribute.Int64(AttrStoreLatency, d.StoreLatency.Microseconds()),
		)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(attribute.String(AttrOutcome, d.Outcome), attribute.Bool(AttrAllowed, d.Allowed))
		}
	}
	span.End()
}

// hashKey is the process's SipHash key, random: a key's hash is the same
// for the process's life, and nobody without it can test a guess (an
// address, a user id) against a hash.
var hashKey0, hashKey1 = func() (uint64, uint64) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("decisiontrace: no randomness: " + err.Error()) // crypto/rand does not fail on supported systems
	}
	return binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
}()

// KeyHash is the hash a span gives key: 16 hex digits of SipHash-2-4 under
// the process's random key. The same key hashes alike in one process, so
// its decisions can be followed; a key cannot be read back from it, nor
// confirmed by hashing a guess, and two processes hash it differently.
func KeyHash(key string) string {
	h := siphash.Hash(hashKey0, hashKey1, []byte(key))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], h)
	return hex.EncodeToString(b[:])
}

// MDCarrier reads a gRPC call's incoming metadata (grpc's metadata.MD:
// lower-case keys) as a propagation carrier.
type MDCarrier map[string][]string

// Get returns the first value of key.
func (c MDCarrier) Get(key string) string {
	if v := c[strings.ToLower(key)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set sets key (unused: spans are only read from calls).
func (c MDCarrier) Set(key, value string) { c[strings.ToLower(key)] = []string{value} }

// Keys lists the keys.
func (c MDCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// FuncCarrier reads headers through a function returning every value of a
// header named in canonical form (gate.RawHTTP's Header).
type FuncCarrier func(canonicalName string) []string

// Get returns the first value of key.
func (c FuncCarrier) Get(key string) string {
	if v := c(http.CanonicalHeaderKey(key)); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set does nothing: the headers are read only.
func (c FuncCarrier) Set(key, value string) {}

// Keys returns the keys the trace context propagator reads.
func (c FuncCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }
