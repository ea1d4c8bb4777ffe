package throttle

import (
	"context"
	"net/http"
	"strings"
)

// Criticality says how much it matters that a request is served, in the
// four levels of Google's SRE book. Lower levels are shed first: when the
// queue is full an arrival may evict a queued request of a lower level,
// and the queue serves higher levels first. The zero value is Sheddable.
type Criticality uint8

// The four levels, from the first shed to the last.
const (
	// Sheddable is traffic that may fail partially and is expected to be
	// retried later (batch, prefetch).
	Sheddable Criticality = iota
	// SheddablePlus is traffic that may fail partially but whose failures
	// are visible (a background refresh a user waits for).
	SheddablePlus
	// Critical is the default for serving traffic: its failures are seen
	// by users.
	Critical
	// CriticalPlus is the most important traffic, shed last.
	CriticalPlus
	numLevels = 4
)

// DefaultCriticality is the level of a request that names none, or names
// one that is not among the four (an unknown, empty, oversized or hostile
// header value): Critical, as in Google's frameworks, so that a client
// which never sets the field is treated as serving traffic.
const DefaultCriticality = Critical

// DefaultHeader is the HTTP header (and, lower-cased, the gRPC metadata
// key) criticality is read from and propagated in unless configured.
const DefaultHeader = "X-Criticality"

var names = [numLevels]string{"SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS"}

// String returns the level's name as the SRE book spells it
// (CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE), or "INVALID".
func (c Criticality) String() string {
	if c < numLevels {
		return names[c]
	}
	return "INVALID"
}

// Valid reports whether c is one of the four levels.
func (c Criticality) Valid() bool { return c < numLevels }

// ParseCriticality reads a level's name: exactly one of the four names,
// in any letter case, with surrounding blanks ignored and "-" accepted for
// "_". Anything else (an empty string, an unknown name, a number, a value
// longer than the longest name) is reported with ok false, and the
// caller's default applies: it never panics and never allocates.
func ParseCriticality(s string) (c Criticality, ok bool) {
	s = strings.TrimSpace(s)
	if len(s) > len("SHEDDABLE_PLUS") {
		return DefaultCriticality, false
	}
	for i, n := range names {
		if equalName(s, n) {
			return Criticality(i), true
		}
	}
	return DefaultCriticality, false
}

func equalName(s, name string) bool {
	if len(s) != len(name) {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b >= 'a' && b <= 'z' {
			b -= 'a' - 'A'
		}
		if b == '-' {
			b = '_'
		}
		if b != name[i] {
			return false
		}
	}
	return true
}

type ctxKey struct{}

// WithCriticality returns a copy of ctx carrying c. An invalid c is
// stored as DefaultCriticality.
func WithCriticality(ctx context.Context, c Criticality) context.Context {
	if !c.Valid() {
		c = DefaultCriticality
	}
	return context.WithValue(ctx, ctxKey{}, c)
}

// FromContext returns the criticality ctx carries, and whether it carries
// one; DefaultCriticality when it does not.
func FromContext(ctx context.Context) (Criticality, bool) {
	c, ok := ctx.Value(ctxKey{}).(Criticality)
	if !ok {
		return DefaultCriticality, false
	}
	return c, true
}

// FromValues reads a level from the values of a header or of gRPC
// metadata (metadata.MD.Get(key) returns such a slice): the first value
// that names a level decides; with none, def (DefaultCriticality if def
// is invalid). A client may send any number of values; at most the first
// four are looked at.
func FromValues(values []string, def Criticality) Criticality {
	if !def.Valid() {
		def = DefaultCriticality
	}
	for i, v := range values {
		if i == 4 {
			break
		}
		if c, ok := ParseCriticality(v); ok {
			return c
		}
	}
	return def
}

// FromHeader reads a level from the header named name (DefaultHeader if
// empty) of h, as FromValues.
func FromHeader(h http.Header, name string, def Criticality) Criticality {
	if name == "" {
		name = DefaultHeader
	}
	return FromValues(h.Values(name), def)
}

// Transport is an http.RoundTripper that propagates the criticality of
// each request's context to the outgoing call in a header, so that a
// server down the chain sheds in the same order. A request whose context
// carries none is sent as it is (the server applies its default); one
// that already has the header keeps it unless Override is set.
type Transport struct {
	// Base sends the requests; http.DefaultTransport if nil.
	Base http.RoundTripper
	// Header is the header's name; DefaultHeader if empty.
	Header string
	// Override replaces a header the caller set with the context's level.
	Override bool
}

// RoundTrip sets the header on a copy of req (a RoundTripper must not
// change its request) and sends it with Base.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	c, ok := FromContext(req.Context())
	if !ok {
		return base.RoundTrip(req)
	}
	name := t.Header
	if name == "" {
		name = DefaultHeader
	}
	if !t.Override && req.Header.Get(name) != "" {
		return base.RoundTrip(req)
	}
	r2 := req.Clone(req.Context())
	r2.Header.Set(name, c.String())
	return base.RoundTrip(r2)
}
