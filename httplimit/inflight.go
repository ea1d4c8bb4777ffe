package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/inflight"
)

// InFlightOptions configure an InFlight cap.
type InFlightOptions struct {
	// Limiter holds the slots (required).
	Limiter inflight.Limiter
	// Key names the request's key; ok false leaves the request uncapped.
	// nil means PeerKey, the client's address.
	Key func(r *http.Request) (key string, ok bool)
	// RetryAfter is the Retry-After of a refusal, rounded up to whole
	// seconds; 0 means 1s.
	RetryAfter time.Duration
	// FailOpen serves a request whose slot could not be asked for (the
	// limiter's store is down); otherwise it gets 503 Service Unavailable.
	FailOpen bool
}

// InFlight caps the requests in flight per key (the concurrent-requests
// limiter): a request past its key's cap is refused at once with 429 Too
// Many Requests and Retry-After, a quota-like refusal, never queued. Use
// an inflight.Memory for one process, an inflightredis.Redis for a fleet.
type InFlight struct {
	o     InFlightOptions
	retry string
}

// NewInFlight returns an in-flight cap.
func NewInFlight(o InFlightOptions) (*InFlight, error) {
	if o.Limiter == nil {
		return nil, errors.New("httplimit: InFlightOptions.Limiter is nil")
	}
	if o.RetryAfter < 0 {
		return nil, fmt.Errorf("httplimit: InFlightOptions.RetryAfter %v is negative", o.RetryAfter)
	}
	if o.Key == nil {
		o.Key = PeerKey
	}
	return &InFlight{o: o, retry: strconv.FormatInt(max(1, int64((o.RetryAfter+time.Second-1)/time.Second)), 10)}, nil
}

// PeerKey is the default key of InFlight: the connection's peer address,
// without its port.
func PeerKey(r *http.Request) (string, bool) {
	a := gate.PeerAddr(r.RemoteAddr)
	if !a.IsValid() {
		return "", false
	}
	return a.String(), true
}

// Handler wraps next: each request holds a slot of its key while next
// serves it.
func (f *InFlight) Handler(next http.Handler) http.Handler {
	key, retry := f.o.Key, f.retry
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, ok := key(r)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		tok, ok, err := f.o.Limiter.Acquire(r.Context(), k)
		switch {
		case err != nil && r.Context().Err() != nil:
			return // the client went away
		case err != nil && f.o.FailOpen:
			next.ServeHTTP(w, r)
		case err != nil:
			writeInFlightRefusal(w, r, http.StatusServiceUnavailable, "1", "in_flight_limiter_unavailable", "in-flight limiter unavailable")
		case !ok:
			writeInFlightRefusal(w, r, http.StatusTooManyRequests, retry, "too_many_in_flight", "too many requests in flight")
		default:
			defer tok.Release()
			next.ServeHTTP(w, r)
		}
	})
}

func writeInFlightRefusal(w http.ResponseWriter, r *http.Request, status int, retry, code, text string) {
	h := w.Header()
	h["Retry-After"] = []string{retry}
	if wantsJSON(r.Header["Accept"]) {
		h["Content-Type"] = []string{"application/json"}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"error":"` + code + `","retry_after":` + retry + "}\n"))
		return
	}
	h["Content-Type"] = []string{"text/plain; charset=utf-8"}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text + "; retry in " + retry + " s\n"))
}

// GateKey returns an InFlightOptions.Key that keys a request as the
// gate's limits would by parts: gate.IP() resolved through the gate's
// trusted proxies (the client behind a load balancer, not the balancer),
// a header, a user, and so on.
func GateKey(g *gate.Gate, parts ...gate.Part) (func(*http.Request) (string, bool), error) {
	f, err := g.KeyFunc(parts...)
	if err != nil {
		return nil, err
	}
	return func(r *http.Request) (string, bool) {
		req := gate.Request{HTTP: r, Peer: r.RemoteAddr}
		return f(&req)
	}, nil
}
