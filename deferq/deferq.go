// Package deferq queues HTTP requests for later: a request a limit would
// refuse is answered 202 Accepted with a location to poll, and its method,
// URL, headers and body go onto a Redis Stream. Workers (any number, in
// any process) read the stream in a consumer group and deliver each
// request to the upstream or handler at the queue's rate, at least once,
// with an Idempotency-Key header; the response is kept for a configured
// time and served at the poll location.
//
//	q, err := deferq.New(client, deferq.Options{Name: "orders", Interval: 100 * time.Millisecond})
//	...
//	go q.Run(ctx, "worker-1", deferq.ToHandler(app, 1<<20))
//	// in a handler: q.Accept(w, r) answers 202 (or 503 when the queue is full)
//	// and q.Poll(w, r, id) answers GET /_floodgate/deferred/orders/ID
//
// Durability is Redis's: an entry added before a crash of the process that
// accepted it is delivered by any worker later. An entry a worker read but
// did not finish (the worker died, the upstream did not answer) stays
// pending in the group and is claimed by another worker after
// Options.ClaimIdle (XAUTOCLAIM), so it is delivered at least once and
// never lost; it may be delivered twice, which the Idempotency-Key (the
// entry's id) lets the upstream notice.
package deferq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/redis/rueidis"
)

// PollPrefix is the path under which Poll serves results:
// PollPrefix + queue name + "/" + id.
const PollPrefix = "/_floodgate/deferred/"

// IdempotencyHeader is the header a delivered request carries: the
// queue's name, "/" and the entry's stream id ("orders/1764200000000-0"),
// the same on every delivery of one request and distinct across queues.
const IdempotencyHeader = "Idempotency-Key"

var (
	// ErrFull is Enqueue's error when the queue holds Options.MaxLen
	// requests not yet delivered.
	ErrFull = errors.New("deferq: queue full")
	// ErrTooLarge is Enqueue's error for a body over Options.MaxBody.
	ErrTooLarge = errors.New("deferq: request body too large")
)

// Clock is the time source: floodgate.Clock's methods.
type Clock interface {
	NowMicro() int64
	Sleep(ctx context.Context, d time.Duration) error
}

// Options configure a Queue. Zero values take the defaults named.
type Options struct {
	// Name names the queue: its Redis keys are "{floodgate:defer:NAME}:…"
	// and its poll path PollPrefix + NAME + "/ID". Required (see CheckName).
	Name string
	// MaxLen bounds the requests queued and not yet delivered; Enqueue
	// answers ErrFull beyond (default 10000).
	MaxLen int64
	// MaxBody bounds a queued request's body in bytes (default 1 MiB).
	MaxBody int64
	// ResultTTL is how long a delivered request's response is kept for
	// polling (default 10 minutes).
	ResultTTL time.Duration
	// Interval is the gap between two deliveries, across all the queue's
	// workers (the rule's rate: its period over its limit); 0 delivers as
	// fast as the workers go.
	Interval time.Duration
	// ClaimIdle is how long an entry a worker read stays with it before
	// another worker takes it over (default 30 s). Make it longer than a
	// delivery takes, or slow deliveries are made twice.
	ClaimIdle time.Duration
	// Block is how long a worker's read waits for a new entry before it
	// looks for abandoned ones again (default 1 s).
	Block time.Duration
	// Clock paces deliveries (default clock.Precise).
	Clock Clock
	// MaxDeliveries bounds the attempts at delivering one request (a
	// transport error, a worker that died): one handed out more times is
	// moved to the dead-letter stream instead, and its poll answers 502
	// (default 5).
	MaxDeliveries int64
	// MaxDead bounds the dead-letter stream: past it the oldest dead
	// request is dropped (default 1000).
	MaxDead int64
	// PollRate bounds the polls one client address makes (Poll,
	// PollStatus), per second, with a burst of twice as many: more are
	// answered 429 without asking Redis (default 10; negative: no
	// bound). The table of clients is bounded (65,536 addresses).
	PollRate float64
	// PollConcurrency bounds the polls of this Queue value asking Redis
	// at once: more are answered 503 at once (default 64).
	PollConcurrency int
}

// Queue is one deferred-request queue on Redis. It is safe for concurrent
// use; many Queues (in many processes) with the same Name share it.
type Queue struct {
	c                      rueidis.Client
	o                      Options
	stream, group, resultP string
	pace, dead             string
	// deadIdx maps a dead letter's id (its poll id's) to its entry in the
	// dead-letter stream; moved maps a requeued request's id to its entry
	// in the stream now (Requeue).
	deadIdx, moved string
	guard          *pollGuard
}

// New makes the queue's consumer group if it does not exist.
func New(c rueidis.Client, o Options) (*Queue, error) {
	if err := o.fill(); err != nil {
		return nil, err
	}
	guard, err := newPollGuard(&o)
	if err != nil {
		return nil, err
	}
	tag := "{floodgate:defer:" + o.Name + "}"
	q := &Queue{c: c, o: o, stream: tag + ":s", group: "workers", resultP: tag + ":r:", pace: tag + ":pace", dead: tag + ":dead",
		deadIdx: tag + ":deadidx", moved: tag + ":moved", guard: guard}
	err = c.Do(context.Background(), c.B().XgroupCreate().Key(q.stream).Group(q.group).Id("0").Mkstream().Build()).Error()
	if err != nil && !rueidis.IsRedisBusyGroup(err) {
		return nil, fmt.Errorf("deferq: creating the consumer group of %q: %w", o.Name, err)
	}
	return q, nil
}

// CheckName reports whether name can name a queue: 1 to 200 letters,
// digits, '-', '_', '.' and '/' (a limit's name, such as "web/orders").
func CheckName(name string) error {
	if name == "" || len(name) > 200 {
		return errors.New("deferq: a queue name must be 1 to 200 characters")
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '/') {
			return fmt.Errorf("deferq: queue name %q: only letters, digits, '-', '_', '.' and '/'", name)
		}
	}
	return nil
}

func (o *Options) fill() error {
	if err := CheckName(o.Name); err != nil {
		return err
	}
	if o.MaxLen < 0 || o.MaxBody < 0 || o.ResultTTL < 0 || o.Interval < 0 || o.ClaimIdle < 0 || o.Block < 0 || o.MaxDeliveries < 0 || o.MaxDead < 0 || o.PollConcurrency < 0 {
		return errors.New("deferq: negative option")
	}
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.MaxLen, 10000)
	def(&o.MaxBody, 1<<20)
	def((*int64)(&o.ResultTTL), int64(10*time.Minute))
	def((*int64)(&o.ClaimIdle), int64(30*time.Second))
	def((*int64)(&o.Block), int64(time.Second))
	def(&o.MaxDeliveries, 5)
	def(&o.MaxDead, 1000)
	if o.PollRate == 0 {
		o.PollRate = 10
	}
	if math.IsNaN(o.PollRate) || math.IsInf(o.PollRate, 0) || o.PollRate > 0 && o.PollRate < 0.001 {
		return errors.New("deferq: PollRate must be a number of polls a second (at least 0.001), or negative for no bound")
	}
	if o.PollConcurrency == 0 {
		o.PollConcurrency = 64
	}
	if o.ClaimIdle < time.Millisecond || o.Block < time.Millisecond {
		return errors.New("deferq: ClaimIdle and Block must be at least 1ms")
	}
	if o.Clock == nil {
		o.Clock = clock.Precise
	}
	return nil
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.o.Name }

// Options returns the queue's options, defaults filled in.
func (q *Queue) Options() Options { return q.o }

// Location returns the poll path of the entry id (as Enqueue returns it).
func (q *Queue) Location(id string) string { return PollPrefix + q.o.Name + "/" + id }

// origin returns the id a stream entry is known by: its poll id's and
// Idempotency-Key's. That is its own id, or for a request requeued from
// the dead-letter stream (Requeue) the id it was first queued with, kept
// in its field "o".
func origin(x rueidis.XRangeEntry) string {
	if o := x.FieldValues["o"]; o != "" {
		return o
	}
	return x.ID
}

// entry is a queued request, as stored in the stream's field "r".
type entry struct {
	Method string              `json:"m"`
	URL    string              `json:"u"`
	Host   string              `json:"host,omitempty"`
	Remote string              `json:"ra,omitempty"` // the client's address, for the handler's RemoteAddr
	Header map[string][]string `json:"h"`
	Body   []byte              `json:"b"`
	Token  string              `json:"t"` // the secret half of the poll id
}

// Result is a delivered request's response.
type Result struct {
	Status int                 `json:"s"`
	Header map[string][]string `json:"h"`
	Body   []byte              `json:"b"`
	Token  string              `json:"t"`
}

// enqueueScript adds ARGV[2] to the stream KEYS[1] unless it holds
// ARGV[1] entries already (delivered entries are deleted, so its length is
// what waits); it returns the new id, or false when full.
var enqueueScript = rueidis.NewLuaScript(`
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[1], '*', 'r', ARGV[2])`)

// enqueue stores e; it returns the poll id: stream id "." token.
func (q *Queue) enqueue(ctx context.Context, e *entry) (string, error) {
	var tok [12]byte
	rand.Read(tok[:]) //nolint:errcheck // never fails
	e.Token = hex.EncodeToString(tok[:])
	b, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	id, err := enqueueScript.Exec(ctx, q.c, []string{q.stream}, []string{fmt.Sprint(q.o.MaxLen), string(b)}).ToString()
	if rueidis.IsRedisNil(err) {
		return "", ErrFull
	}
	if err != nil {
		return "", fmt.Errorf("deferq: enqueue on %q: %w", q.o.Name, err)
	}
	return id + "." + e.Token, nil
}

// Len returns the number of requests queued and not yet delivered.
func (q *Queue) Len(ctx context.Context) (int64, error) {
	return q.c.Do(ctx, q.c.B().Xlen().Key(q.stream).Build()).AsInt64()
}

// Oldest returns when the oldest request still queued was accepted (by
// Redis's clock, from its stream id), and false when none is: the queue's
// age, for metrics.
func (q *Queue) Oldest(ctx context.Context) (time.Time, bool, error) {
	es, err := q.c.Do(ctx, q.c.B().Xrange().Key(q.stream).Start("-").End("+").Count(1).Build()).AsXRange()
	if err != nil || len(es) == 0 {
		return time.Time{}, false, err
	}
	ms, _, _ := strings.Cut(es[0].ID, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("deferq: stream id %q: %w", es[0].ID, err)
	}
	return time.UnixMilli(n), true, nil
}
