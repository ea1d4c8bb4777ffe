package deferq

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Deliver sends one queued request and returns its response. An error
// leaves the request queued: another delivery is tried after ClaimIdle.
type Deliver func(ctx context.Context, r *http.Request) (*Result, error)

// paceScript reserves the next delivery slot of the queue: it returns how
// many microseconds to wait for it (ARGV[1] now, ARGV[2] the interval,
// both in microseconds).
var paceScript = rueidis.NewLuaScript(`
local now = tonumber(ARGV[1])
local nxt = tonumber(redis.call('GET', KEYS[1]) or '0')
if nxt < now then nxt = now end
local after = nxt + tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%d', after), 'PX', math.floor((after - now) / 1000) + 60000)
return nxt - now`)

// finishScript acknowledges entry ARGV[2] of group ARGV[1] of the stream
// KEYS[1], keeps its result ARGV[4] for ARGV[3] ms at KEYS[2] (the
// result key of its origin ARGV[5]), forgets where a requeued request
// moved (KEYS[3]) and deletes the entry; an entry another delivery
// acknowledged first is left alone (returns 0).
var finishScript = rueidis.NewLuaScript(`
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[5])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1`)

// Run delivers the queue's requests with d as consumer (a name unique
// among the queue's live workers, e.g. host and pid) until ctx ends. It
// retries Redis errors after a short pause.
func (q *Queue) Run(ctx context.Context, consumer string, d Deliver) error {
	for ctx.Err() == nil {
		if _, err := q.Once(ctx, consumer, d); err != nil && ctx.Err() == nil {
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	return nil
}

// Once takes one request (an abandoned one first, else a new one, waiting
// up to Options.Block), waits for its delivery slot and delivers it. It
// reports whether it delivered one.
func (q *Queue) Once(ctx context.Context, consumer string, d Deliver) (bool, error) {
	x, claimed, ok, err := q.next(ctx, consumer)
	if err != nil || !ok {
		return false, err
	}
	if claimed {
		// handed out before: a delivery failed, or its worker died
		n, err := q.deliveries(ctx, x.ID)
		if err != nil {
			return false, fmt.Errorf("deferq: counting the deliveries of %s of %q: %w", x.ID, q.o.Name, err)
		}
		if n > q.o.MaxDeliveries {
			var e entry
			json.Unmarshal([]byte(x.FieldValues["r"]), &e) //nolint:errcheck // a corrupt entry has no token: its polls are 404
			return false, q.deadLetter(ctx, x, e.Token, n)
		}
	}
	if q.o.Interval > 0 {
		wait, err := paceScript.Exec(ctx, q.c, []string{q.pace},
			[]string{strconv.FormatInt(q.o.Clock.NowMicro(), 10), strconv.FormatInt(q.o.Interval.Microseconds(), 10)}).AsInt64()
		if err != nil {
			return false, fmt.Errorf("deferq: pacing %q: %w", q.o.Name, err)
		}
		if err := q.o.Clock.Sleep(ctx, time.Duration(wait)*time.Microsecond); err != nil {
			return false, err
		}
	}
	return true, q.deliver(ctx, x, d)
}

// next claims an abandoned entry (claimed) or reads a new one.
func (q *Queue) next(ctx context.Context, consumer string) (x rueidis.XRangeEntry, claimed, ok bool, err error) {
	idle := strconv.FormatInt(q.o.ClaimIdle.Milliseconds(), 10)
	arr, err := q.c.Do(ctx, q.c.B().Xautoclaim().Key(q.stream).Group(q.group).Consumer(consumer).
		MinIdleTime(idle).Start("0-0").Count(1).Build()).ToArray()
	if err != nil {
		return rueidis.XRangeEntry{}, false, false, fmt.Errorf("deferq: claiming on %q: %w", q.o.Name, err)
	}
	if len(arr) >= 2 {
		if es, err := arr[1].AsXRange(); err == nil && len(es) > 0 && es[0].FieldValues != nil {
			return es[0], true, true, nil
		}
	}
	res, err := q.c.Do(ctx, q.c.B().Xreadgroup().Group(q.group, consumer).Count(1).Block(q.o.Block.Milliseconds()).
		Streams().Key(q.stream).Id(">").Build()).AsXRead()
	if isNil(err) {
		return rueidis.XRangeEntry{}, false, false, nil
	}
	if err != nil {
		return rueidis.XRangeEntry{}, false, false, fmt.Errorf("deferq: reading %q: %w", q.o.Name, err)
	}
	if es := res[q.stream]; len(es) > 0 {
		return es[0], false, true, nil
	}
	return rueidis.XRangeEntry{}, false, false, nil
}

// deliver sends entry x through d and stores the result.
func (q *Queue) deliver(ctx context.Context, x rueidis.XRangeEntry, d Deliver) error {
	var e entry
	if err := json.Unmarshal([]byte(x.FieldValues["r"]), &e); err != nil {
		// Not ours or corrupt: acknowledge it away rather than retry forever.
		return q.finish(ctx, x, &Result{Status: http.StatusInternalServerError, Body: []byte("corrupt deferred entry\n")})
	}
	r, err := http.NewRequestWithContext(ctx, e.Method, e.URL, bytes.NewReader(e.Body))
	if err != nil {
		return q.finish(ctx, x, &Result{Status: http.StatusBadRequest, Body: []byte("bad deferred request\n"), Token: e.Token})
	}
	r.Header = http.Header(e.Header)
	if r.Header == nil {
		r.Header = http.Header{}
	}
	r.Header.Set(IdempotencyHeader, q.o.Name+"/"+origin(x)) // stream ids repeat across queues; a requeued request keeps its first
	r.RequestURI, r.Host, r.RemoteAddr = e.URL, e.Host, e.Remote
	res, err := d(ctx, r)
	if err != nil {
		return fmt.Errorf("deferq: delivering %s of %q (left pending): %w", x.ID, q.o.Name, err)
	}
	res.Token = e.Token
	for k := range res.Header {
		if hopHeaders[http.CanonicalHeaderKey(k)] {
			delete(res.Header, k) // the body may be cut: its length is the poll's to set
		}
	}
	return q.finish(ctx, x, res)
}

// finish stores entry x's result under its origin's id, for its polls,
// and deletes it.
func (q *Queue) finish(ctx context.Context, x rueidis.XRangeEntry, res *Result) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	orig := origin(x)
	err = finishScript.Exec(ctx, q.c, []string{q.stream, q.resultP + orig, q.moved},
		[]string{q.group, x.ID, strconv.FormatInt(max(1, q.o.ResultTTL.Milliseconds()), 10), string(b), orig}).Error()
	if err != nil {
		return fmt.Errorf("deferq: storing the result of %s of %q: %w", orig, q.o.Name, err)
	}
	return nil
}

// ToHandler delivers to h in this process, keeping up to maxBody bytes of
// the response body (the rest is dropped). A panic in h is a 500 result.
func ToHandler(h http.Handler, maxBody int64) Deliver {
	return func(ctx context.Context, r *http.Request) (res *Result, err error) {
		rec := &recorder{h: http.Header{}, max: maxBody}
		defer func() {
			if p := recover(); p != nil {
				res = &Result{Status: http.StatusInternalServerError, Body: []byte("handler panicked\n")}
			}
		}()
		h.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		return &Result{Status: rec.status, Header: rec.h, Body: rec.body.Bytes()}, nil
	}
}

// ToUpstream delivers over HTTP to base (scheme://host[:port]) + the
// request's URI with client, keeping up to maxBody bytes of the response
// body. A transport error leaves the request queued for another try.
func ToUpstream(client *http.Client, base string, maxBody int64) Deliver {
	base = strings.TrimSuffix(base, "/")
	return func(ctx context.Context, r *http.Request) (*Result, error) {
		out, err := http.NewRequestWithContext(ctx, r.Method, base+r.RequestURI, r.Body)
		if err != nil {
			return nil, err
		}
		out.Header, out.ContentLength = r.Header, r.ContentLength
		if r.Host != "" {
			out.Host = r.Host
		}
		resp, err := client.Do(out)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err != nil {
			return nil, err
		}
		return &Result{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
	}
}

type recorder struct {
	h      http.Header
	status int
	body   bytes.Buffer
	max    int64
}

func (w *recorder) Header() http.Header { return w.h }

func (w *recorder) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if room := w.max - int64(w.body.Len()); room > 0 {
		w.body.Write(p[:min(int64(len(p)), room)])
	}
	return len(p), nil
}
