package deferq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// ErrNotDead is Requeue's error for an id that is not in the dead-letter
// stream: never dead-lettered, requeued already (by another call too),
// or dropped from the stream past Options.MaxDead.
var ErrNotDead = errors.New("deferq: no such dead letter")

// deadScript moves entry ARGV[2] of group ARGV[1] from the stream KEYS[1]
// to the dead-letter stream KEYS[2] under its origin's id ARGV[6], which
// the index KEYS[4] maps to its dead-letter entry; keeps the stream at
// ARGV[5] entries (the oldest dropped, with their index); keeps ARGV[4]
// as its result for ARGV[3] ms at KEYS[3]; forgets where a requeued
// request moved (KEYS[5]); and deletes the entry. An entry another
// worker acknowledged first is left alone (returns 0).
var deadScript = rueidis.NewLuaScript(`
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #e > 0 then
  local f = e[1][2]
  local r = ''
  for i = 1, #f, 2 do if f[i] == 'r' then r = f[i + 1] end end
  local did = redis.call('XADD', KEYS[2], '*', 'id', ARGV[6], 'r', r)
  redis.call('HSET', KEYS[4], ARGV[6], did)
  local over = redis.call('XLEN', KEYS[2]) - tonumber(ARGV[5])
  if over > 0 then
    for _, x in ipairs(redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', over)) do
      local g = x[2]
      for i = 1, #g, 2 do
        if g[i] == 'id' and redis.call('HGET', KEYS[4], g[i + 1]) == x[1] then redis.call('HDEL', KEYS[4], g[i + 1]) end
      end
      redis.call('XDEL', KEYS[2], x[1])
    end
  end
end
redis.call('HDEL', KEYS[5], ARGV[6])
redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1`)

// requeueScript moves the dead letter ARGV[1] (its origin's id, found in
// the index KEYS[2]) from the dead-letter stream KEYS[1] back onto the
// stream KEYS[3] as a new entry (its request as it was, its origin in
// field "o"), unless the stream holds ARGV[2] entries already; records
// where it moved (KEYS[4]) and deletes its 502 result (KEYS[5]), so that
// its poll answers pending again. It returns the new entry's id, 0 for
// no such dead letter, -1 for a full queue (nothing moved). One script:
// the entry is never in both streams, nor in neither, and of two
// requeues of one id, one moves it and the other finds nothing.
var requeueScript = rueidis.NewLuaScript(`
local did = redis.call('HGET', KEYS[2], ARGV[1])
if not did then return 0 end
local e = redis.call('XRANGE', KEYS[1], did, did)
if #e == 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 0
end
if redis.call('XLEN', KEYS[3]) >= tonumber(ARGV[2]) then return -1 end
local f = e[1][2]
local r = ''
for i = 1, #f, 2 do if f[i] == 'r' then r = f[i + 1] end end
local nid = redis.call('XADD', KEYS[3], '*', 'r', r, 'o', ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], nid)
redis.call('XDEL', KEYS[1], did)
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[5])
return nid`)

// deliveries returns how many times entry id has been handed to a worker
// (its pending entry's delivery count, this hand-over included), 0 if it
// is not pending.
func (q *Queue) deliveries(ctx context.Context, id string) (int64, error) {
	arr, err := q.c.Do(ctx, q.c.B().Xpending().Key(q.stream).Group(q.group).Start(id).End(id).Count(1).Build()).ToArray()
	if err != nil || len(arr) == 0 {
		return 0, err
	}
	row, err := arr[0].ToArray()
	if err != nil || len(row) < 4 {
		return 0, err
	}
	return row[3].AsInt64()
}

// deadLetter moves entry x, handed out more than MaxDeliveries times, to
// the dead-letter stream and answers its polls with 502 from now on.
func (q *Queue) deadLetter(ctx context.Context, x rueidis.XRangeEntry, token string, n int64) error {
	res := &Result{Status: http.StatusBadGateway, Token: token,
		Header: map[string][]string{"Content-Type": {"text/plain; charset=utf-8"}},
		Body:   fmt.Appendf(nil, "the deferred request could not be delivered (%d attempts); it was moved to the dead-letter queue\n", n-1)}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	orig := origin(x)
	err = deadScript.Exec(ctx, q.c, []string{q.stream, q.dead, q.resultP + orig, q.deadIdx, q.moved},
		[]string{q.group, x.ID, strconv.FormatInt(max(1, q.o.ResultTTL.Milliseconds()), 10), string(b), strconv.FormatInt(q.o.MaxDead, 10), orig}).Error()
	if err != nil {
		return fmt.Errorf("deferq: dead-lettering %s of %q: %w", orig, q.o.Name, err)
	}
	return nil
}

// DeadLen returns the number of requests in the queue's dead-letter
// stream: those whose delivery failed Options.MaxDeliveries times (at
// most Options.MaxDead are kept, the newest).
func (q *Queue) DeadLen(ctx context.Context) (int64, error) {
	return q.c.Do(ctx, q.c.B().Xlen().Key(q.dead).Build()).AsInt64()
}

// Dead is a request in the dead-letter stream.
type Dead struct {
	// ID is its id: its poll id's first half, and its Idempotency-Key is
	// the queue's name, "/" and ID (kept when it is requeued).
	ID string
	// Method, URL and Header are the request's as queued.
	Method, URL string
	Header      map[string][]string
}

// DeadLetters returns up to n requests of the dead-letter stream, the
// oldest first, for an operator to inspect (and Requeue those that
// should be tried again).
func (q *Queue) DeadLetters(ctx context.Context, n int64) ([]Dead, error) {
	ds, _, err := q.deadRange(ctx, "-", "+", n)
	return ds, err
}

// deadRange returns up to n dead letters from start to end (ids of the
// dead-letter stream, XRANGE's syntax) and the id of the last one's
// entry there.
func (q *Queue) deadRange(ctx context.Context, start, end string, n int64) ([]Dead, string, error) {
	es, err := q.c.Do(ctx, q.c.B().Xrange().Key(q.dead).Start(start).End(end).Count(n).Build()).AsXRange()
	if err != nil {
		return nil, "", err
	}
	out := make([]Dead, 0, len(es))
	last := ""
	for _, x := range es {
		d := Dead{ID: x.FieldValues["id"]}
		var e entry
		if json.Unmarshal([]byte(x.FieldValues["r"]), &e) == nil {
			d.Method, d.URL, d.Header = e.Method, e.URL, e.Header
		}
		out = append(out, d)
		last = x.ID
	}
	return out, last, nil
}

// Requeue moves the dead letter id (Dead.ID) back onto the queue, in one
// Redis script: it is delivered as a fresh request (at the queue's pace,
// its delivery count from zero, MaxDeliveries attempts again), with the
// same Idempotency-Key, and its poll location answers 202 pending again,
// then its new result. It is never lost nor duplicated: of two Requeues
// of one id, even at once, one moves it and the other returns
// ErrNotDead. It returns ErrNotDead for an id not in the dead-letter
// stream, ErrFull when the queue holds Options.MaxLen requests (nothing
// is moved).
func (q *Queue) Requeue(ctx context.Context, id string) error {
	if !validSID(id) {
		return fmt.Errorf("%w: %q is not a stream id (MS-SEQ)", ErrNotDead, id)
	}
	v, err := requeueScript.Exec(ctx, q.c, []string{q.dead, q.deadIdx, q.stream, q.moved, q.resultP + id},
		[]string{id, strconv.FormatInt(q.o.MaxLen, 10)}).ToAny()
	if err != nil {
		return fmt.Errorf("deferq: requeueing %s of %q: %w", id, q.o.Name, err)
	}
	switch v {
	case int64(0):
		return fmt.Errorf("%w: %s in %q", ErrNotDead, id, q.o.Name)
	case int64(-1):
		return fmt.Errorf("%w: requeueing %s of %q", ErrFull, id, q.o.Name)
	}
	return nil
}

// RequeueAll requeues the dead letters there are when it is called, the
// oldest first, each as Requeue does, and returns how many it moved. It
// stops at the first error (ErrFull: the queue filled up; those not
// moved stay dead letters). A dead letter another caller requeued
// meanwhile is skipped.
func (q *Queue) RequeueAll(ctx context.Context) (int, error) {
	tail, err := q.c.Do(ctx, q.c.B().Xrevrange().Key(q.dead).End("+").Start("-").Count(1).Build()).AsXRange()
	if err != nil {
		return 0, fmt.Errorf("deferq: reading the dead letters of %q: %w", q.o.Name, err)
	}
	if len(tail) == 0 {
		return 0, nil
	}
	moved, start := 0, "-"
	for {
		ds, last, err := q.deadRange(ctx, start, tail[0].ID, 100)
		if err != nil {
			return moved, fmt.Errorf("deferq: reading the dead letters of %q: %w", q.o.Name, err)
		}
		for _, d := range ds {
			switch err := q.Requeue(ctx, d.ID); {
			case err == nil:
				moved++
			case !errors.Is(err, ErrNotDead):
				return moved, err
			}
		}
		if len(ds) < 100 {
			return moved, nil
		}
		start = "(" + last
	}
}

// validSID reports whether s is a stream id, MS-SEQ.
func validSID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	return ok && digits(ms) && digits(seq)
}
