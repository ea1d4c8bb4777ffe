package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// The admin API's throttle on failed attempts: each client network (an
// IPv4 address, an IPv6 /64) may send AdminFailureLimit requests without
// the right token per AdminFailurePeriod, refilled continuously (one every
// AdminFailurePeriod/AdminFailureLimit); beyond that every request from it
// gets 429 with a Retry-After, whatever its token, until the allowance has
// refilled. At most AdminThrottleClients networks are tracked at once.
const (
	AdminFailureLimit    = 10
	AdminFailurePeriod   = time.Minute
	AdminThrottleClients = 1 << 16
)

// newAdminAuthCounter is floodgate_admin_auth_failures_total, both its
// results present from the start (at 0).
func newAdminAuthCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_admin_auth_failures_total",
		Help: "Admin API requests refused by result: bad_token (401: no or a wrong bearer token, within the client network's allowance), throttled (429: the client network had used its allowance of failures; the token was not looked at)."},
		[]string{"result"})
	c.WithLabelValues("bad_token")
	c.WithLabelValues("throttled")
	return c
}

// tokenSum is a token's SHA-256.
type tokenSum = [sha256.Size]byte

func sumToken(s string) tokenSum { return sha256.Sum256([]byte(s)) }

// tokenEqual reports whether got is the token whose sum is want, in time
// that depends on neither: both are hashed to 32 bytes first, so how long
// the right token is cannot be told from how soon a wrong one is refused
// (subtle.ConstantTimeCompare returns at once on unequal lengths).
func tokenEqual(got string, want tokenSum) bool {
	g := sumToken(got)
	return subtle.ConstantTimeCompare(g[:], want[:]) == 1
}

// tokenGuard checks the admin API's bearer token and throttles the
// failures of each client network (AdminFailureLimit a period) with a
// Floodgate limiter on a memory store of its own.
type tokenGuard struct {
	want     tokenSum
	limiter  *floodgate.Limiter
	bad      prometheus.Counter // nil without metrics
	throttle prometheus.Counter
	log      *slog.Logger
}

// newTokenGuard makes the guard of token: its failures counted in m (may
// be nil), its throttle timed by clk.
func newTokenGuard(token string, clk floodgate.Clock, m *Metrics, log *slog.Logger) *tokenGuard {
	// No background sweep (nothing to stop): an idle network's key is back
	// at fresh within a period, and fresh keys are dropped whenever a
	// shard would grow; AdminThrottleClients bounds the rest.
	st := memstore.MustNew(memstore.Options{MaxKeys: AdminThrottleClients, MaxMemory: 16 << 20, Shards: 8, SweepInterval: -1, Clock: clk, Logger: log})
	// A policy of the guard's own (a store keeps its tables with the
	// policy: a shared one would hold every guard's store for good). A
	// store that cannot take a key (none today: memstore decides at once)
	// admits, so the token is still compared: the token's strength, not
	// the throttle, is what keeps a guesser out (at 128 bits no rate of
	// guessing finds it), and a guard that refused everyone when full
	// would let a flood of addresses lock the operators out.
	p := floodgate.MustPolicy("", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: AdminFailureLimit, Period: AdminFailurePeriod,
		OnStoreFailure: floodgate.FailOpen})
	g := &tokenGuard{want: sumToken(token), limiter: floodgate.NewLimiter(p, st, floodgate.WithClock(clk)), log: log}
	if m != nil {
		g.bad = m.adminAuth.WithLabelValues("bad_token")
		g.throttle = m.adminAuth.WithLabelValues("throttled")
	}
	return g
}

// wrap guards h. Each request takes one of its network's allowance before
// its token is looked at, and a right token gives it back: so however many
// guesses arrive at once, no more than the allowance are compared, while
// an operator's calls cost nothing. A network without allowance left gets
// 429 even with the right token (a 200 among the 429s would tell a guess
// right); other networks are not affected.
func (g *tokenGuard) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := clientNetwork(r.RemoteAddr)
		// not the request's context: a client that leaves at once must
		// still have its attempt counted
		ctx := context.WithoutCancel(r.Context())
		d, err := g.limiter.Allow(ctx, key)
		if err == nil && !d.Allowed {
			if g.throttle != nil {
				g.throttle.Inc()
			}
			w.Header().Set("Retry-After", strconv.FormatInt(max(d.RetryAfterSeconds(), 1), 10))
			httpError(w, http.StatusTooManyRequests, "too many requests without the right bearer token from this address: retry after the Retry-After seconds")
			return
		}
		if err != nil {
			g.log.Warn("admin API: the failed-token throttle could not decide; the token is compared unthrottled", "client", key, "err", err)
		}
		// the scheme's name is case-insensitive (RFC 9110, 11.1)
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got = strings.TrimLeft(got, " ") // 1*SP after the scheme (RFC 9110, 11.4)
		ok := tokenEqual(got, g.want)
		if !strings.EqualFold(scheme, "Bearer") || !ok {
			if g.bad != nil {
				g.bad.Inc()
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="floodgate-admin"`)
			httpError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		if err == nil {
			g.limiter.Refund(ctx, key, 1)
		}
		h.ServeHTTP(w, r)
	})
}

// clientNetwork is the key a client's failures count under: its IPv4
// address, or its IPv6 /64 (one host is given a whole /64, as the gate
// keys clients), an IPv4-mapped IPv6 address as its IPv4 address. Clients
// without an IP address (a unix socket) share one key.
func clientNetwork(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		a, err := netip.ParseAddr(remote)
		if err != nil {
			return "local"
		}
		ap = netip.AddrPortFrom(a, 0)
	}
	a := ap.Addr().Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// RequireToken guards h with a bearer token as AdminHandler does: a
// request without "Authorization: Bearer <token>" gets 401, and a client
// network's failures beyond AdminFailureLimit a period get 429. Every
// handler the service guards with one token shares one throttle, counted
// in the service's metrics. An empty token guards nothing.
func (s *Service) RequireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	s.guardMu.Lock()
	defer s.guardMu.Unlock()
	g := s.guards[token]
	if g == nil {
		if s.guards == nil {
			s.guards = map[string]*tokenGuard{}
		}
		g = newTokenGuard(token, s.opts.Clock, s.opts.Metrics, s.opts.Logger)
		s.guards[token] = g
	}
	return g.wrap(h)
}

// RequireToken guards h with a bearer token, as Service.RequireToken does,
// with a throttle of its own on clock.Coarse and no metrics. An empty token
// guards nothing.
func RequireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return newTokenGuard(token, clock.Coarse, nil, slog.Default()).wrap(h)
}
