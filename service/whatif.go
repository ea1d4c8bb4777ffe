package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
)

// WhatIfFile is the name a what-if's rules file is parsed under: its
// errors read "whatif.yaml:LINE: field: message".
const WhatIfFile = "whatif.yaml"

// Bounds on a what-if (it runs on the admin listener).
const (
	// whatIfStoreMemory caps the key tables of each of a what-if's two
	// replay stores; a key that finds no room is decided by its rule's
	// failure mode and counted as degraded.
	whatIfStoreMemory = 128 << 20
	// whatIfCheckEvery is how many requests are replayed between two
	// looks at the deadline.
	whatIfCheckEvery = 256
	// whatIfOverrideKeys and whatIfOverrideBytes cap the keys whose
	// override a what-if remembers (looked up once for both replays) and
	// their bytes; past either, a key's override is asked of the
	// overrides store (its cache) at each use.
	whatIfOverrideKeys  = 1 << 18
	whatIfOverrideBytes = 32 << 20
)

// whatIfResult is POST /v1/whatif's answer.
type whatIfResult struct {
	Domain    string     `json:"domain"`
	Window    whatIfSpan `json:"window"`
	Candidate whatIfRun  `json:"candidate"` // the rules posted
	Current   whatIfRun  `json:"current"`   // the live rules, over the same requests
	// OverridesApplied: the service has an overrides store, and both
	// replays decided each key under its override as it is now.
	OverridesApplied bool `json:"overrides_applied"`
	// OverrideLookupFailures counts the keys whose override could not be
	// read (the overrides store failed or the deadline passed): the
	// rules decided them, as they would live.
	OverrideLookupFailures int      `json:"override_lookup_failures,omitempty"`
	Notes                  []string `json:"notes,omitempty"`
}

// whatIfSpan is the window a what-if replayed.
type whatIfSpan struct {
	From     time.Time `json:"from"`     // the window asked for
	To       time.Time `json:"to"`       // now, by the service's clock
	Requests int       `json:"requests"` // recorded requests of the domain in it, replayed
	// Recorded: requests of every domain in the window.
	Recorded int `json:"recorded"`
	// Truncated: the recorder's caps dropped requests of the window;
	// the replay covers them from CoversFrom.
	Truncated  bool      `json:"truncated"`
	CoversFrom time.Time `json:"covers_from"`
	// Complete is false when the replay ran out of time and stopped
	// after Replayed requests (its counts are of those).
	Complete bool `json:"complete"`
	Replayed int  `json:"replayed"`
}

// whatIfRun is one rule set's replay.
type whatIfRun struct {
	Loaded          bool `json:"loaded"`           // the rules define the domain
	RequestsRefused int  `json:"requests_refused"` // requests answered OVER_LIMIT
	// RequestsUnderOverride: requests with a descriptor decided under
	// its key's override.
	RequestsUnderOverride int          `json:"requests_under_override"`
	Invalid               int          `json:"invalid"` // requests the service refuses as malformed
	Rules                 []whatIfRule `json:"rules"`   // in file order; then the descriptors' own limits

	byLimit map[*rules.Limit]*whatIfRule
}

// whatIfRule is one limit's counts, over the descriptors it decided.
type whatIfRule struct {
	Name            string `json:"name"`
	File            string `json:"file"`
	Line            int    `json:"line"`
	Shadow          bool   `json:"shadow_mode,omitempty"`
	Quota           bool   `json:"quota_mode,omitempty"`
	Matched         int64  `json:"matched"`
	Allowed         int64  `json:"allowed"`
	Refused         int64  `json:"refused"`                    // OVER_LIMIT
	ShadowRefused   int64  `json:"shadow_refused"`             // over, admitted by shadow mode
	QuotaViolations int64  `json:"quota_violations,omitempty"` // over, admitted by quota mode
	Degraded        int64  `json:"degraded,omitempty"`         // the replay store had no room: the failure mode decided
	Overridden      int64  `json:"overridden,omitempty"`       // decided under the key's override (of the counts above)
}

// adminWhatIf serves POST /v1/whatif?minutes=M: the posted rules file
// replayed over the recorded requests of its domain, and the live rules
// over the same, each on a fresh memory store of its own on a manual clock.
func (s *Service) adminWhatIf(w http.ResponseWriter, r *http.Request) {
	if s.reqLog == nil {
		httpError(w, http.StatusConflict, "what-if: this server records no requests (serve --record-window 0, or floodgate proxy, whose requests go through its gate); nothing to replay")
		return
	}
	d, err := s.whatIfMinutes(r.URL.Query().Get("minutes"))
	if err != nil {
		httpError(w, http.StatusBadRequest, "minutes: %v", err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rules.MaxFileSize))
	if err != nil {
		bodyError(w, "rules file", err)
		return
	}
	dom, err := rules.ParseWith(WhatIfFile, body, s.opts.Record.Rules)
	if err != nil {
		rulesError(w, err)
		return
	}
	cand, err := rules.NewConfig(dom)
	if err != nil {
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	select {
	case s.whatIf <- struct{}{}:
		defer func() { <-s.whatIf }()
	default:
		w.Header().Set("Retry-After", "1")
		httpError(w, http.StatusTooManyRequests, "what-if: another what-if is running; one at a time")
		return
	}
	res := s.runWhatIf(r.Context(), cand, dom.Name, s.reqLog.snapshot(s.opts.Clock.NowMicro(), d))
	writeJSON(w, res)
}

// whatIfMinutes reads ?minutes=M: a number of minutes above 0, at most
// the recorder's window (the default).
func (s *Service) whatIfMinutes(v string) (time.Duration, error) {
	window := time.Duration(s.reqLog.window) * time.Microsecond
	if v == "" {
		return window, nil
	}
	m, err := strconv.ParseFloat(v, 64)
	if err != nil || !(m > 0) || m > window.Minutes() {
		return 0, fmt.Errorf("want a number of minutes above 0 and at most %g (the recorded window), got %q", window.Minutes(), v)
	}
	return time.Duration(m * float64(time.Minute)), nil
}

// rulesError answers 400 with a rules file's errors, each with its line.
func rulesError(w http.ResponseWriter, err error) {
	type item struct {
		Line  int    `json:"line"`
		Field string `json:"field,omitempty"`
		Msg   string `json:"message"`
		Text  string `json:"text"` // file:line: field: message
	}
	var items []item
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		if re, ok := errors.AsType[*rules.Error](e); ok {
			items = append(items, item{Line: re.Line, Field: re.Field, Msg: re.Msg, Text: re.Error()})
		} else {
			items = append(items, item{Msg: e.Error(), Text: e.Error()})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	json.NewEncoder(w).Encode(map[string]any{"error": err.Error(), "errors": items})
}

// runWhatIf replays rec's requests of domain under cand and under the
// live rules, side by side, until done or ctx's deadline.
func (s *Service) runWhatIf(ctx context.Context, cand *rules.Config, domain string, rec recording) *whatIfResult {
	live := s.rules.Load()
	out := &whatIfResult{Domain: domain, Window: whatIfSpan{
		From: time.UnixMicro(rec.from).UTC(), To: time.UnixMicro(rec.to).UTC(), Recorded: len(rec.records),
		Truncated: rec.truncated, CoversFrom: time.UnixMicro(rec.coversFrom).UTC(), Complete: true,
	}}
	var ovr *whatIfOverrides
	if s.opts.Overrides != nil {
		ovr = &whatIfOverrides{ctx: ctx, src: overrides.Lookup(s.opts.Overrides), seen: map[string]whatIfOverride{}}
		out.OverridesApplied = true
	}
	runs := [2]*replayer{s.newReplayer(cand, domain, ovr, &out.Candidate), s.newReplayer(live, domain, ovr, &out.Current)}
	defer runs[0].close()
	defer runs[1].close()
	for i := range rec.records {
		r := &rec.records[i]
		if r.domain != domain {
			continue
		}
		if out.Window.Requests%whatIfCheckEvery == 0 && ctx.Err() != nil {
			out.Window.Complete = false
			break
		}
		out.Window.Requests++
		for _, run := range runs {
			run.replay(r)
		}
		out.Window.Replayed++
	}
	if !out.Window.Complete {
		out.Notes = append(out.Notes, fmt.Sprintf("the replay ran out of time (the admin timeout, %s) after %d requests: the counts are of those", s.adminTimeout(), out.Window.Replayed))
	}
	if ovr != nil {
		out.OverrideLookupFailures = int(ovr.failures.Load())
		out.Notes = append(out.Notes, fmt.Sprintf("per-key overrides applied as they are now (%d requests under one with the candidate, %d with the live rules)", out.Candidate.RequestsUnderOverride, out.Current.RequestsUnderOverride))
		if n := out.OverrideLookupFailures; n > 0 {
			out.Notes = append(out.Notes, fmt.Sprintf("%d keys' overrides could not be read (the overrides store failed or the deadline passed): their rules decided them", n))
		}
	}
	if rec.truncated {
		out.Notes = append(out.Notes, fmt.Sprintf("the recorder's caps dropped older requests: the replay covers the newest, from %s", out.Window.CoversFrom.Format(time.RFC3339Nano)))
	}
	for _, run := range runs {
		run.finish()
	}
	return out
}

// replayer replays requests under one rule set on a store of its own.
type replayer struct {
	s      *Service
	cfg    *rules.Config
	domain string
	dec    *decide.Decider
	store  *memstore.Store
	clk    *clock.Manual
	out    *whatIfRun
	res    []decide.Result
	one    [1]decide.Descriptor
	own    []*rules.Limit // the descriptors' own limits met, in order
}

func (s *Service) newReplayer(cfg *rules.Config, domain string, ovr *whatIfOverrides, out *whatIfRun) *replayer {
	out.byLimit = map[*rules.Limit]*whatIfRule{}
	if d := cfg.Domain(domain); d != nil {
		out.Loaded = true
		for _, l := range d.Limits() {
			out.byLimit[l] = &whatIfRule{Name: l.Name, File: l.File, Line: l.Line, Shadow: l.ShadowMode || s.opts.ShadowMode, Quota: l.QuotaMode}
		}
	}
	return &replayer{
		s: s, cfg: cfg, domain: domain, out: out, clk: clock.NewManual(time.Unix(0, 0)),
		dec: decide.New(decide.Options{
			Overrides: ovr.lookup(), OverrideTimeout: s.opts.OverrideTimeout,
			ShadowMode: s.opts.ShadowMode, AllowRequestLimits: s.opts.AllowRequestLimits, Logger: s.opts.Logger,
		}),
		store: memstore.MustNew(memstore.Options{
			MaxMemory: whatIfStoreMemory, Shards: 8, SweepInterval: -1, Logger: s.opts.Logger,
		}),
	}
}

func (p *replayer) close() { p.store.Close() }

// replay decides one request at its recorded time and counts it.
func (p *replayer) replay(r *record) {
	p.clk.SetMicro(r.at)
	descs := r.descriptors(&p.one)
	if cap(p.res) < len(descs) {
		p.res = make([]decide.Result, len(descs))
	}
	res := p.res[:len(descs)]
	// the replay's own deadline is checked between requests; a memory
	// store does not wait
	if err := p.dec.Decide(context.Background(), p.store, p.clk, p.cfg, p.domain, descs, res); err != nil {
		p.out.Invalid++ // a memory store fails only a malformed request
		return
	}
	over, overridden := false, false
	for i := range res {
		if !res[i].Decided() {
			continue
		}
		p.count(&res[i])
		over = over || res[i].Code == decide.Over
		overridden = overridden || underOverride(&res[i])
	}
	if over {
		p.out.RequestsRefused++
	}
	if overridden {
		p.out.RequestsUnderOverride++
	}
}

// underOverride reports whether r was decided under its key's override:
// a policy other than its rules-file limit's (and not its own limit's).
func underOverride(r *decide.Result) bool {
	return !r.Own && r.Policy != nil && r.Limit != nil && r.Policy != r.Limit.Policy
}

// count adds a decided descriptor to its limit's counts.
func (p *replayer) count(r *decide.Result) {
	c := p.out.byLimit[r.Limit]
	if c == nil { // a descriptor's own limit (AllowRequestLimits)
		c = &whatIfRule{Name: "own limit: " + r.Limit.Name, Shadow: r.Shadow}
		p.out.byLimit[r.Limit] = c
		p.own = append(p.own, r.Limit)
	}
	c.Matched++
	switch {
	case r.Code == decide.Over:
		c.Refused++
	case r.Code == decide.QuotaViolation:
		c.QuotaViolations++
	case r.Shadow && !r.Decision.Allowed:
		c.ShadowRefused++
	default:
		c.Allowed++
	}
	if r.Decision.Degraded {
		c.Degraded++
	}
	if underOverride(r) {
		c.Overridden++
	}
}

// whatIfOverrides is a what-if's view of the per-key overrides: each key
// looked up once (through the service's overrides store and its cache)
// and remembered for both replays, so that a replay asks the store at most
// once a distinct key (up to whatIfOverrideKeys), under the what-if's
// deadline. A failed lookup is counted and answers "none" for the key,
// for the rest of the what-if: the rules decide it, as they would live,
// and the decider does not stop asking for the other keys.
type whatIfOverrides struct {
	ctx context.Context // the what-if's: a lookup ends at its deadline
	src rules.Overrides
	// mu guards seen and bytes: a replay is one goroutine, but the
	// lookups of a request's descriptors run at once
	mu       sync.Mutex
	seen     map[string]whatIfOverride // domain NUL key → the answer
	bytes    int                       // the remembered keys' bytes, roughly
	failures atomic.Int64
}

type whatIfOverride struct {
	o  rules.Override
	ok bool
}

// lookup returns w as the replays' decider reads it (nil: no overrides).
func (w *whatIfOverrides) lookup() rules.Overrides {
	if w == nil {
		return nil
	}
	return w
}

// Lookup implements rules.Overrides.
func (w *whatIfOverrides) Lookup(ctx context.Context, domain, key string) (rules.Override, bool, error) {
	k := decide.StoreKey(domain, key)
	w.mu.Lock()
	a, hit := w.seen[k]
	w.mu.Unlock()
	if hit {
		return a.o, a.ok, nil
	}
	// the decider's context is the replay's (no deadline of its own): the
	// what-if's bounds the lookup
	lctx, cancel := context.WithCancel(w.ctx)
	stop := context.AfterFunc(ctx, cancel)
	o, ok, err := w.src.Lookup(lctx, domain, key)
	stop()
	cancel()
	if err != nil {
		// remembered too: the key is decided by its rules for the whole
		// what-if, and the store is not asked again for it
		w.failures.Add(1)
		o, ok = rules.Override{}, false
	}
	w.mu.Lock()
	if len(w.seen) < whatIfOverrideKeys && w.bytes+len(k) <= whatIfOverrideBytes {
		w.seen[k] = whatIfOverride{o, ok}
		w.bytes += len(k) + 64 // the entry, roughly
	}
	w.mu.Unlock()
	return o, ok, nil
}

// MayHave reports whether domain may have overrides (the store's answer),
// so that a domain with none costs its replay no lookup.
func (w *whatIfOverrides) MayHave(domain string) bool {
	if k, ok := w.src.(interface{ MayHave(string) bool }); ok {
		return k.MayHave(domain)
	}
	return true
}

// finish lists the counts: the domain's limits in file order, then the
// own limits met.
func (p *replayer) finish() {
	p.out.Rules = []whatIfRule{}
	if d := p.cfg.Domain(p.domain); d != nil {
		for _, l := range d.Limits() {
			p.out.Rules = append(p.out.Rules, *p.out.byLimit[l])
		}
	}
	for _, l := range p.own {
		p.out.Rules = append(p.out.Rules, *p.out.byLimit[l])
	}
}
