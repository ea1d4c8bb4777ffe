package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"

	"github.com/floodgate/floodgate/deferq"
)

// The proxy's admin routes of the defer queues' dead letters (deferq's
// dead-letter streams), behind the admin token:
//
//	GET  /v1/deadletters[?queue=NAME][&limit=N]   each queue's dead letters, the oldest first (N each, default 100)
//	POST /v1/deadletters/requeue                  {"queue": NAME, "id": ID} or {"queue": NAME, "all": true}
//
// A requeue answers {"queue", "requeued"}; an unknown queue or dead
// letter 404, a full queue 503, each with {"error"}.

// deadLettersJSON is one queue's part of GET /v1/deadletters.
type deadLettersJSON struct {
	Queue   string           `json:"queue"`
	Dead    int64            `json:"dead"`
	Letters []deadLetterJSON `json:"letters"`
}

// deadLetterJSON is one dead letter.
type deadLetterJSON struct {
	ID     string              `json:"id"`
	Method string              `json:"method"`
	URL    string              `json:"url"`
	Header map[string][]string `json:"header,omitempty"`
}

// requeueJSON is POST /v1/deadletters/requeue's body.
type requeueJSON struct {
	Queue string `json:"queue"`
	ID    string `json:"id,omitempty"`
	All   bool   `json:"all,omitempty"`
}

// requeuedJSON is its answer.
type requeuedJSON struct {
	Queue    string `json:"queue"`
	Requeued int    `json:"requeued"`
}

// adminJSONError answers code with {"error": msg}.
func adminJSONError(w http.ResponseWriter, code int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf(format, args...)}) //nolint:errcheck // the client may be gone
}

func adminJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v) //nolint:errcheck // the client may be gone
}

// queue returns the running queue named name, or answers 404 naming the
// queues there are.
func (d *deferWorkers) queue(w http.ResponseWriter, name string) *deferq.Queue {
	qs := d.current()
	names := make([]string, 0, len(qs))
	for _, q := range qs {
		if q.Name() == name {
			return q
		}
		names = append(names, q.Name())
	}
	sort.Strings(names)
	if len(names) == 0 {
		adminJSONError(w, http.StatusNotFound, "no deferred queue named %q: the proxy has none (no http route with action: defer, or no --store redis)", name)
	} else {
		adminJSONError(w, http.StatusNotFound, "no deferred queue named %q; the queues are %q", name, names)
	}
	return nil
}

// listDeadLetters serves GET /v1/deadletters.
func (d *deferWorkers) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	limit := int64(100)
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 || n > 10000 {
			adminJSONError(w, http.StatusBadRequest, "limit %q: want 1 to 10000", s)
			return
		}
		limit = n
	}
	qs := d.current()
	if name := r.URL.Query().Get("queue"); name != "" {
		q := d.queue(w, name)
		if q == nil {
			return
		}
		qs = []*deferq.Queue{q}
	}
	out := []deadLettersJSON{}
	for _, q := range qs {
		n, err := q.DeadLen(r.Context())
		if err != nil {
			adminJSONError(w, http.StatusServiceUnavailable, "the dead letters of %q: %v", q.Name(), err)
			return
		}
		ds, err := q.DeadLetters(r.Context(), limit)
		if err != nil {
			adminJSONError(w, http.StatusServiceUnavailable, "the dead letters of %q: %v", q.Name(), err)
			return
		}
		dj := deadLettersJSON{Queue: q.Name(), Dead: n, Letters: make([]deadLetterJSON, 0, len(ds))}
		for _, x := range ds {
			dj.Letters = append(dj.Letters, deadLetterJSON{ID: x.ID, Method: x.Method, URL: x.URL, Header: x.Header})
		}
		out = append(out, dj)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	adminJSON(w, map[string]any{"queues": out})
}

// requeueDeadLetters serves POST /v1/deadletters/requeue.
func (d *deferWorkers) requeueDeadLetters(w http.ResponseWriter, r *http.Request) {
	var body requeueJSON
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		adminJSONError(w, http.StatusBadRequest, `the body: %v; want {"queue": NAME, "id": ID} or {"queue": NAME, "all": true}`, err)
		return
	}
	if body.Queue == "" || (body.ID == "") == !body.All {
		adminJSONError(w, http.StatusBadRequest, `want {"queue": NAME, "id": ID} or {"queue": NAME, "all": true}: a queue, and an id or all`)
		return
	}
	q := d.queue(w, body.Queue)
	if q == nil {
		return
	}
	var n int
	var err error
	if body.All {
		n, err = q.RequeueAll(r.Context())
	} else if err = q.Requeue(r.Context(), body.ID); err == nil {
		n = 1
	}
	switch {
	case err == nil:
		d.log.Info("dead letters requeued", "queue", q.Name(), "id", body.ID, "all", body.All, "requeued", n)
		adminJSON(w, requeuedJSON{Queue: q.Name(), Requeued: n})
	case errors.Is(err, deferq.ErrNotDead):
		adminJSONError(w, http.StatusNotFound, "no dead letter %q in %q (never dead, requeued already, or dropped past --defer-max-dead)", body.ID, q.Name())
	case errors.Is(err, deferq.ErrFull):
		w.Header().Set("Retry-After", "1")
		adminJSONError(w, http.StatusServiceUnavailable, "the queue %q is full (its max_queue); requeued %d before it filled; retry once it drains", q.Name(), n)
	default:
		adminJSONError(w, http.StatusServiceUnavailable, "requeueing in %q (requeued %d): %v", q.Name(), n, err)
	}
}
