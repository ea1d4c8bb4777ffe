package deferq

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/redis/rueidis"
)

// hopHeaders are not queued: they belong to the accepting connection.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Content-Length": true,
}

// Enqueue reads r (its body up to Options.MaxBody) onto the queue and
// returns its poll id. It answers ErrTooLarge for a longer body, ErrFull
// when the queue holds Options.MaxLen requests.
func (q *Queue) Enqueue(ctx context.Context, r *http.Request) (string, error) {
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, q.o.MaxBody+1))
		if err != nil {
			return "", err
		}
		if int64(len(b)) > q.o.MaxBody {
			return "", ErrTooLarge
		}
		body = b
	}
	h := make(map[string][]string, len(r.Header))
	for k, v := range r.Header {
		if !hopHeaders[http.CanonicalHeaderKey(k)] {
			h[k] = v
		}
	}
	return q.enqueue(ctx, &entry{Method: r.Method, URL: r.URL.RequestURI(), Host: r.Host, Remote: r.RemoteAddr, Header: h, Body: body})
}

// Accept enqueues r and answers 202 Accepted with Location: the poll path
// of the entry, and Retry-After: 1. A full queue (or Redis down) answers
// 503 Service Unavailable with Retry-After; a body over MaxBody answers 413.
func (q *Queue) Accept(w http.ResponseWriter, r *http.Request) {
	id, err := q.Enqueue(r.Context(), r)
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	switch {
	case err == nil:
		h.Set("Location", q.Location(id))
		h.Set("Retry-After", "1")
		writeText(w, http.StatusAccepted, "accepted for later delivery; poll "+q.Location(id)+"\n")
	case errors.Is(err, ErrTooLarge):
		writeText(w, http.StatusRequestEntityTooLarge, "request body too large to queue\n")
	case errors.Is(err, ErrFull):
		h.Set("Retry-After", "1")
		writeText(w, http.StatusServiceUnavailable, "deferred queue full; retry later\n")
	default:
		h.Set("Retry-After", "1")
		writeText(w, http.StatusServiceUnavailable, "deferred queue unavailable; retry later\n")
	}
}

func writeText(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, s) //nolint:errcheck // the client may be gone
}

// State is what Status finds for a poll id.
type State int

const (
	// Unknown: no such request, a wrong token, or its result expired.
	Unknown State = iota
	// Pending: queued or being delivered.
	Pending
	// Done: delivered; the Result is kept until Options.ResultTTL.
	Done
)

// parseID splits a poll id "MS-SEQ.TOKEN" and checks its shape.
func parseID(id string) (sid, tok string, ok bool) {
	sid, tok, ok = strings.Cut(id, ".")
	if !ok || len(tok) != 24 || len(sid) > 41 {
		return "", "", false
	}
	ms, seq, ok := strings.Cut(sid, "-")
	if !ok || !digits(ms) || !digits(seq) {
		return "", "", false
	}
	for _, c := range tok {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", "", false
		}
	}
	return sid, tok, true
}

func digits(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// statusScript looks up the request ARGV[1]: its result (KEYS[1]) if it
// has one, returned as {1, result}; else its entry in the stream KEYS[2],
// where it is under its own id or, requeued, under the id KEYS[3] maps
// it to, returned as {2, request}; else nothing. One script, so that a
// delivery finishing in between (result stored, entry deleted) is never
// seen as neither.
var statusScript = rueidis.NewLuaScript(`
local r = redis.call('GET', KEYS[1])
if r then return {1, r} end
local id = redis.call('HGET', KEYS[3], ARGV[1]) or ARGV[1]
local e = redis.call('XRANGE', KEYS[2], id, id)
if #e == 0 then return false end
local f = e[1][2]
local req, o = nil, ARGV[1]
for i = 1, #f, 2 do
  if f[i] == 'r' then req = f[i + 1] elseif f[i] == 'o' then o = f[i + 1] end
end
if req == nil or o ~= ARGV[1] then return false end
return {2, req}`)

// Status looks up the poll id: Done with its result, Pending, or Unknown
// (a malformed id is Unknown, not an error). A request requeued from the
// dead-letter stream (Requeue) is found under its first id.
func (q *Queue) Status(ctx context.Context, id string) (State, *Result, error) {
	sid, tok, ok := parseID(id)
	if !ok {
		return Unknown, nil, nil
	}
	arr, err := statusScript.Exec(ctx, q.c, []string{q.resultP + sid, q.stream, q.moved}, []string{sid}).ToArray()
	if isNil(err) {
		return Unknown, nil, nil
	}
	if err != nil {
		return Unknown, nil, err
	}
	if len(arr) != 2 {
		return Unknown, nil, nil
	}
	kind, _ := arr[0].AsInt64()
	s, _ := arr[1].ToString()
	switch kind {
	case 1:
		var res Result
		if json.Unmarshal([]byte(s), &res) != nil || res.Token != tok {
			return Unknown, nil, nil
		}
		return Done, &res, nil
	case 2:
		var e entry
		if json.Unmarshal([]byte(s), &e) == nil && e.Token == tok {
			return Pending, nil, nil
		}
	}
	return Unknown, nil, nil
}

// Poll answers a poll of id: 202 Accepted (Retry-After: 1) while the
// request waits, its stored response (status, headers, body) once
// delivered, 404 for an unknown, malformed or expired id, 503 when Redis
// cannot be asked. A client (r.RemoteAddr) over Options.PollRate gets
// 429, and a poll past Options.PollConcurrency 503, both with
// Retry-After: 1 and without asking Redis (PollStatus).
func (q *Queue) Poll(w http.ResponseWriter, r *http.Request, id string) {
	st, res, err := q.PollStatus(r.Context(), r.RemoteAddr, id)
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	switch {
	case errors.Is(err, ErrPollRate):
		h.Set("Retry-After", "1")
		writeText(w, http.StatusTooManyRequests, "too many polls; retry later\n")
	case err != nil:
		h.Set("Retry-After", "1")
		writeText(w, http.StatusServiceUnavailable, "deferred queue unavailable; retry later\n")
	case st == Pending:
		h.Set("Retry-After", "1")
		writeText(w, http.StatusAccepted, "pending\n")
	case st == Done:
		for k, v := range res.Header {
			h[k] = v
		}
		w.WriteHeader(res.Status)
		w.Write(res.Body) //nolint:errcheck // the client may be gone
	default:
		writeText(w, http.StatusNotFound, "no such deferred request (or its result expired)\n")
	}
}

// ServeHTTP serves the queue's poll path, PollPrefix + name + "/ID"; any
// other path is 404.
func (q *Queue) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutPrefix(r.URL.Path, PollPrefix+q.o.Name+"/")
	if !ok || r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.NotFound(w, r)
		return
	}
	q.Poll(w, r, id)
}

func isNil(err error) bool { return rueidis.IsRedisNil(err) }
