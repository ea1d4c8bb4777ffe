package overrides

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
)

// Size limits of an override's strings, in bytes.
const (
	MaxDomainLen = 255  // Override.Domain
	MaxKeyLen    = 4096 // Override.Key
	MaxNoteLen   = 1024 // Override.Note
	// MaxLimit caps Limit and Burst: the largest requests_per_unit a rule
	// file and Envoy's API can say (32 bits).
	MaxLimit = 1<<32 - 1
	// MaxListLimit caps List's page size.
	MaxListLimit = 1000
)

// An Override replaces the limit for one key of one domain.
type Override struct {
	// Domain is the rules domain the override applies in.
	Domain string `json:"domain"`
	// Key is the descriptor's store key as the service builds it, e.g.
	// "user=241531"; opaque to this package (any bytes but empty).
	Key string `json:"key"`
	// Limit requests per Period; Limit > 0, Period a whole number of
	// microseconds of at least 1µs, as in floodgate.Rule.
	Limit  int64         `json:"limit"`
	Period time.Duration `json:"period"` // a Go duration string ("1s") in JSON
	// Burst is the bucket's capacity; 0 means Limit, as in floodgate.Rule.
	Burst int64 `json:"burst,omitempty"`
	// Algorithm, when set, replaces the matched rule's algorithm.
	Algorithm floodgate.Algorithm `json:"algorithm,omitempty"`
	Note      string              `json:"note,omitempty"` // free text for people: why, who, until when
	// Updated is when the override was last written. Put and PutMany stamp
	// it with the current time when it is zero, and keep it otherwise (so a
	// restored backup keeps its times). Stores keep it to the nanosecond,
	// in UTC.
	Updated time.Time `json:"updated"`
}

// overrideJSON is Override's JSON form: Period as a duration string.
type overrideJSON struct {
	Domain    string              `json:"domain"`
	Key       string              `json:"key"`
	Limit     int64               `json:"limit"`
	Period    string              `json:"period"`
	Burst     int64               `json:"burst,omitempty"`
	Algorithm floodgate.Algorithm `json:"algorithm,omitempty"`
	Note      string              `json:"note,omitempty"`
	Updated   time.Time           `json:"updated"`
}

// MarshalJSON writes Period as a Go duration string ("1s", "1m30s").
func (o Override) MarshalJSON() ([]byte, error) {
	return json.Marshal(overrideJSON{
		Domain: o.Domain, Key: o.Key, Limit: o.Limit, Period: o.Period.String(),
		Burst: o.Burst, Algorithm: o.Algorithm, Note: o.Note, Updated: o.Updated,
	})
}

// UnmarshalJSON reads Period as a Go duration string. It does not
// validate: call Validate. It takes unknown fields (a json.Decoder's
// DisallowUnknownFields does not reach into it); DecodeJSON does not.
func (o *Override) UnmarshalJSON(b []byte) error {
	var j overrideJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return jsonError(err)
	}
	return o.fromJSON(&j)
}

// DecodeJSON reads one override from r, strictly: an unknown field (a
// misspelt "brust") or anything after the object is an error, since either
// would leave the caller with an override other than the one meant. It
// does not validate: call Validate.
func DecodeJSON(r io.Reader) (Override, error) {
	var j overrideJSON
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Override{}, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Override{}, errors.New("override: more after the JSON object")
	}
	var o Override
	err := o.fromJSON(&j)
	return o, err
}

func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return &FieldError{Field: te.Field, Msg: fmt.Sprintf("want a JSON %s, got %s", te.Type, te.Value)}
	}
	return err
}

func (o *Override) fromJSON(j *overrideJSON) error {
	var d time.Duration
	if j.Period != "" {
		var err error
		if d, err = time.ParseDuration(j.Period); err != nil {
			return &FieldError{Domain: j.Domain, Key: j.Key, Field: "period", Msg: fmt.Sprintf("want a duration such as \"1s\" or \"1m30s\", got %q", j.Period)}
		}
	}
	*o = Override{
		Domain: j.Domain, Key: j.Key, Limit: j.Limit, Period: d,
		Burst: j.Burst, Algorithm: j.Algorithm, Note: j.Note, Updated: j.Updated,
	}
	return nil
}

// A FieldError reports an invalid override, naming the field as in JSON.
type FieldError struct {
	// Domain and Key are the override's, as given.
	Domain, Key string
	Field       string // "domain", "key", "limit", "period", "burst", "algorithm", "note"
	Msg         string // what is wrong with the field
}

// Error returns `override "DOMAIN"/"KEY": FIELD: MSG` (the key cut to 64
// bytes), or `override: FIELD: MSG` when neither is known.
func (e *FieldError) Error() string {
	if e.Domain == "" && e.Key == "" {
		return fmt.Sprintf("override: %s: %s", e.Field, e.Msg)
	}
	return fmt.Sprintf("override %q/%q: %s: %s", e.Domain, truncate(e.Key, 64), e.Field, e.Msg)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Validate checks the override and returns a *FieldError naming the first
// bad field. The limit, period, burst and algorithm are checked as a
// floodgate.Rule of the override's algorithm (token_bucket when none is
// set) would be; the rule the override is finally applied to (Apply) may
// still reject them (a window algorithm has no burst apart from its limit,
// sliding_subwindow needs its rule's granularity to divide the period), so
// the service must check the policy it builds as well.
func (o Override) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Domain: o.Domain, Key: o.Key, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case o.Domain == "":
		return bad("domain", "must not be empty")
	case len(o.Domain) > MaxDomainLen:
		return bad("domain", "at most %d bytes, got %d", MaxDomainLen, len(o.Domain))
	case !utf8.ValidString(o.Domain):
		return bad("domain", "must be UTF-8")
	case containsByte(o.Domain, 0):
		return bad("domain", "must not contain NUL")
	case o.Key == "":
		return bad("key", "must not be empty")
	case len(o.Key) > MaxKeyLen:
		return bad("key", "at most %d bytes, got %d", MaxKeyLen, len(o.Key))
	case !utf8.ValidString(o.Key):
		// store keys are UTF-8 (the service writes a request's invalid
		// bytes as \xNN); one that is not could not be listed, got or
		// deleted by what a listing shows
		return bad("key", "must be UTF-8")
	case o.Limit <= 0:
		return bad("limit", "must be positive, got %d", o.Limit)
	case o.Limit > MaxLimit:
		return bad("limit", "at most %d, got %d", int64(MaxLimit), o.Limit)
	case o.Period < time.Microsecond:
		return bad("period", "must be at least 1µs, got %s", o.Period)
	case o.Period%time.Microsecond != 0:
		return bad("period", "must be a whole number of microseconds, got %s", o.Period)
	case o.Burst < 0:
		return bad("burst", "must not be negative, got %d", o.Burst)
	case o.Burst > MaxLimit:
		return bad("burst", "at most %d, got %d", int64(MaxLimit), o.Burst)
	case len(o.Note) > MaxNoteLen:
		return bad("note", "at most %d bytes, got %d", MaxNoteLen, len(o.Note))
	case !utf8.ValidString(o.Note):
		return bad("note", "must be UTF-8")
	}
	r := floodgate.Rule{Name: "override", Algorithm: o.Algorithm, Limit: o.Limit, Period: o.Period, Burst: o.Burst}
	if r.Algorithm == floodgate.SlidingSubwindow {
		r.Granularity = o.Period // the real granularity is the rule's
	}
	if _, err := floodgate.NewPolicy("", r); err != nil {
		var re *floodgate.RuleError
		if errors.As(err, &re) {
			return bad(re.Field, "%s", re.Msg)
		}
		return bad("limit", "%v", err)
	}
	return nil
}

func containsByte(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}

// Apply returns rule r with the override's limit in place: Limit, Period
// and Burst replaced (a zero Burst meaning Limit), and Algorithm when the
// override sets one. The rule's name, mode and failure mode are kept; a
// calendar window becomes a plain Period window, and the refill style and
// granularity are dropped when the new algorithm has none.
func (o Override) Apply(r floodgate.Rule) floodgate.Rule { return o.numbers().Apply(r) }

// A Store keeps overrides. Implementations are safe for concurrent use.
type Store interface {
	// Put validates o (Validate), stamps Updated when it is zero, and
	// writes it, replacing any override of the same domain and key.
	Put(ctx context.Context, o Override) error
	// Get returns the override of key in domain, and whether there is one.
	Get(ctx context.Context, domain, key string) (Override, bool, error)
	// Delete removes the override of key in domain and reports whether
	// there was one.
	Delete(ctx context.Context, domain, key string) (bool, error)
	// List returns up to limit overrides of domain with keys after after
	// (all keys when after is ""), in byte order of their keys. A limit
	// of 0 or less, or above MaxListLimit, means MaxListLimit. The next
	// page starts after the last key returned; a page shorter than the
	// limit is the last.
	List(ctx context.Context, domain, after string, limit int) ([]Override, error)
	// Close releases what the store holds (a Bolt file, say).
	Close() error
}

// A BatchStore writes many overrides at once: far faster than one Put
// each (Bolt: one transaction and one fsync per batch; Redis: one round
// trip per domain and batch). Bolt, Redis and Cache implement it.
type BatchStore interface {
	Store
	// PutMany validates every override first and writes none when one is
	// invalid (the error names the override and its field). Batches of
	// 1,000 to 50,000 overrides suit both stores.
	PutMany(ctx context.Context, batch []Override) error
}

// PutMany writes batch with s's PutMany when s is a BatchStore, and one Put
// at a time otherwise.
func PutMany(ctx context.Context, s Store, batch []Override) error {
	if b, ok := s.(BatchStore); ok {
		return b.PutMany(ctx, batch)
	}
	for _, o := range batch {
		if err := s.Put(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// A Watcher reports changes to a store's overrides made by any process,
// so caches in other processes can drop what they hold. Redis implements
// it with Redis pub/sub; a Cache over a Watcher watches it.
type Watcher interface {
	// Watch calls onChange with the domain and key of each override
	// changed anywhere, and onReset whenever changes may have been missed
	// and everything cached must be dropped: each time the watch is (re)
	// established, and after a bulk change. The calls come one at a time
	// from another goroutine, until stop is called (stop waits for them to
	// end).
	Watch(onChange func(domain, key string), onReset func()) (stop func())
}

// prepare validates every override and stamps zero Updated times.
func prepare(batch []Override, now time.Time) error {
	for i := range batch {
		if err := batch[i].Validate(); err != nil {
			return err
		}
		if batch[i].Updated.IsZero() {
			batch[i].Updated = now
		}
	}
	return nil
}

func normLimit(limit int) int {
	if limit <= 0 || limit > MaxListLimit {
		return MaxListLimit
	}
	return limit
}

// The stored value of an override (Bolt and Redis alike), without its
// domain and key, which the layout holds:
//
//	version byte (1)
//	uvarint limit, uvarint period in ns, uvarint burst,
//	varint Updated in Unix ns (0: zero time),
//	uvarint length + algorithm, uvarint length + note
const codecVersion = 1

func encodeValue(dst []byte, o Override) []byte {
	dst = append(dst, codecVersion)
	dst = binary.AppendUvarint(dst, uint64(o.Limit))
	dst = binary.AppendUvarint(dst, uint64(o.Period))
	dst = binary.AppendUvarint(dst, uint64(o.Burst))
	var ts int64
	if !o.Updated.IsZero() {
		ts = o.Updated.UnixNano()
	}
	dst = binary.AppendVarint(dst, ts)
	dst = binary.AppendUvarint(dst, uint64(len(o.Algorithm)))
	dst = append(dst, o.Algorithm...)
	dst = binary.AppendUvarint(dst, uint64(len(o.Note)))
	dst = append(dst, o.Note...)
	return dst
}

var errCorrupt = errors.New("overrides: corrupt stored value")

func decodeValue(domain, key string, b []byte) (Override, error) {
	o := Override{Domain: domain, Key: key}
	if len(b) == 0 || b[0] != codecVersion {
		if len(b) > 0 {
			return o, fmt.Errorf("overrides: %q/%q: stored value of unknown version %d", domain, key, b[0])
		}
		return o, errCorrupt
	}
	b = b[1:]
	uv := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			b = nil
			return 0
		}
		b = b[n:]
		return v
	}
	o.Limit = int64(uv())
	o.Period = time.Duration(uv())
	o.Burst = int64(uv())
	ts, n := binary.Varint(b)
	if n <= 0 {
		return o, errCorrupt
	}
	b = b[n:]
	if ts != 0 {
		o.Updated = time.Unix(0, ts).UTC()
	}
	str := func() (string, bool) {
		l, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < l {
			return "", false
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		return s, true
	}
	alg, ok1 := str()
	note, ok2 := str()
	if !ok1 || !ok2 {
		return o, errCorrupt
	}
	o.Algorithm, o.Note = floodgate.Algorithm(alg), note
	return o, nil
}

// Lookup adapts s to the rules decider's lookups (nil for a nil s).
func Lookup(s Store) rules.Overrides {
	if s == nil {
		return nil
	}
	return lookup{s}
}

type lookup struct{ s Store }

func (l lookup) Lookup(ctx context.Context, domain, key string) (rules.Override, bool, error) {
	o, ok, err := l.s.Get(ctx, domain, key)
	return o.numbers(), ok, err
}

// MayHave reports whether domain may have overrides (true when the store
// cannot say).
func (l lookup) MayHave(domain string) bool {
	if k, ok := l.s.(interface{ MayHave(string) bool }); ok {
		return k.MayHave(domain)
	}
	return true
}

// numbers is o's numbers, as the decider applies them.
func (o Override) numbers() rules.Override {
	return rules.Override{Limit: o.Limit, Period: o.Period, Burst: o.Burst, Algorithm: o.Algorithm}
}
