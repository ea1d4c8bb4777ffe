package deferq

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/redis/rueidis"
)

// deadScript moves entry ARGV[2] of group ARGV[1] from the stream KEYS[1]
// to the dead-letter stream KEYS[2] (capped at ARGV[5] entries, the
// oldest dropped), keeps ARGV[4] as its result for ARGV[3] ms at KEYS[3],
// and deletes it; an entry another worker acknowledged first is left
// alone (returns 0).
var deadScript = rueidis.NewLuaScript(`
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #e > 0 then
  local f = e[1][2]
  local r = ''
  for i = 1, #f, 2 do if f[i] == 'r' then r = f[i + 1] end end
  redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[5], '*', 'id', ARGV[2], 'r', r)
end
redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1`)

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

// deadLetter moves entry id, handed out more than MaxDeliveries times, to
// the dead-letter stream and answers its polls with 502 from now on.
func (q *Queue) deadLetter(ctx context.Context, id, token string, n int64) error {
	res := &Result{Status: http.StatusBadGateway, Token: token,
		Header: map[string][]string{"Content-Type": {"text/plain; charset=utf-8"}},
		Body:   fmt.Appendf(nil, "the deferred request could not be delivered (%d attempts); it was moved to the dead-letter queue\n", n-1)}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	err = deadScript.Exec(ctx, q.c, []string{q.stream, q.dead, q.resultP + id},
		[]string{q.group, id, strconv.FormatInt(max(1, q.o.ResultTTL.Milliseconds()), 10), string(b), strconv.FormatInt(q.o.MaxDead, 10)}).Error()
	if err != nil {
		return fmt.Errorf("deferq: dead-lettering %s of %q: %w", id, q.o.Name, err)
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
	// ID is its id in the queue's stream (its Idempotency-Key is the
	// queue's name, "/" and ID).
	ID string
	// Method, URL and Header are the request's as queued.
	Method, URL string
	Header      map[string][]string
}

// DeadLetters returns up to n requests of the dead-letter stream, the
// oldest first, for an operator to inspect (and enqueue again if they
// should be retried).
func (q *Queue) DeadLetters(ctx context.Context, n int64) ([]Dead, error) {
	es, err := q.c.Do(ctx, q.c.B().Xrange().Key(q.dead).Start("-").End("+").Count(n).Build()).AsXRange()
	if err != nil {
		return nil, err
	}
	out := make([]Dead, 0, len(es))
	for _, x := range es {
		d := Dead{ID: x.FieldValues["id"]}
		var e entry
		if json.Unmarshal([]byte(x.FieldValues["r"]), &e) == nil {
			d.Method, d.URL, d.Header = e.Method, e.URL, e.Header
		}
		out = append(out, d)
	}
	return out, nil
}
