package adaptive

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Transport is an http.RoundTripper that throttles adaptively per target
// (the request's host by default) and retries refused requests within the
// retry budget.
type Transport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Throttle keeps the counts (required).
	Throttle *Throttle
	// Target names a request's backend; nil means its URL's host.
	Target func(*http.Request) string
	// Refused tells an overload refusal; nil means a transport error, 429
	// or 503.
	Refused func(*http.Response, error) bool
	// Retries is the most retries of one refused request (each one also
	// taken from the retry budget and throttled as any request); 0: none.
	// Only requests whose body can be sent again (none, or GetBody set)
	// are retried.
	Retries int
}

// RefusedHTTP is the default Transport.Refused: a transport error, 429 Too
// Many Requests or 503 Service Unavailable.
func RefusedHTTP(resp *http.Response, err error) bool {
	return err != nil || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable
}

// RoundTrip sends req unless the throttle drops it (an error wrapping
// ErrThrottled), and retries it while it is refused, Retries allows and
// the budget has room.
func (tr *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if tr.Throttle == nil {
		return nil, errors.New("adaptive: Transport.Throttle is nil")
	}
	base, target, refused := tr.Base, req.URL.Host, tr.Refused
	if base == nil {
		base = http.DefaultTransport
	}
	if tr.Target != nil {
		target = tr.Target(req)
	}
	if refused == nil {
		refused = RefusedHTTP
	}
	for attempt := 0; ; attempt++ {
		if !tr.Throttle.Admit(target, attempt > 0) {
			closeBody(req)
			return nil, fmt.Errorf("%w (%s)", ErrThrottled, target)
		}
		resp, err := base.RoundTrip(req)
		bad := refused(resp, err)
		tr.Throttle.Done(target, !bad)
		if !bad || attempt >= tr.Retries || !rewindable(req) || !tr.Throttle.AllowRetry(target) {
			return resp, err
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // to reuse the connection, if it can
			resp.Body.Close()
		}
		if req, err = rewind(req); err != nil {
			return nil, err
		}
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

func rewindable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// rewind returns req with a fresh body for another attempt.
func rewind(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("adaptive: a retry's body: %w", err)
	}
	r := req.Clone(req.Context())
	r.Body = body
	return r, nil
}
