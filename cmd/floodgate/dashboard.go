package main

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/internal/dashboard"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/internal/topk"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
	"github.com/floodgate/floodgate/throttle"
)

// lastReload is the result of a rule loader's last read.
type lastReload struct {
	mu  sync.Mutex
	at  time.Time
	err error
	set bool
}

// record records a read's result: err nil when every file loaded.
func (l *lastReload) record(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at, l.err, l.set = time.Now(), err, true
}

func (l *lastReload) get() dashboard.Reload {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := dashboard.Reload{Time: l.at, OK: l.set && l.err == nil}
	if l.err != nil {
		r.Error = l.err.Error()
	}
	return r
}

// newDashboard returns serve's dashboard, nil with --no-dashboard.
func (c *serveConfig) newDashboard(svc *service.Service, st *serveStores, loader *ruleLoader) *dashboard.Dashboard {
	if c.noDashboard {
		return nil
	}
	src := &serveSource{svc: svc, st: st, loader: loader}
	trackTiers(svc.Recorder(), st.store)
	return dashboard.New(src, dashboard.Options{Token: c.adminToken, Guard: svc.RequireToken, Admin: svc.AdminHandler(""), Server: "serve"})
}

// sampleEverySecond samples rec once a second until the returned stop is
// called (nothing to do for a nil rec).
func sampleEverySecond(rec *recorder.Recorder) (stop func()) {
	if rec == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		rec.Sample(time.Now().Unix())
		for {
			select {
			case now := <-t.C:
				rec.Sample(now.Unix())
			case <-done:
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// serveSource is what serve shows on its dashboard.
type serveSource struct {
	svc    *service.Service
	st     *serveStores
	loader *ruleLoader
}

func (s *serveSource) Series(since int64) ([]recorder.Series, recorder.Latency, int64) {
	return s.svc.Recorder().Since(since)
}

func (s *serveSource) Tracks(since, upto int64) []recorder.TrackSeries {
	return s.svc.Recorder().Tracks(since, upto)
}

func (s *serveSource) Top(n int) []service.TopRule { return s.svc.TopLimited("", "", n) }

func (s *serveSource) Health() dashboard.Health { return storeHealth(s.st.store, s.st.ready) }

func (s *serveSource) Rules() *dashboard.Rules {
	return &dashboard.Rules{Limits: dashboardLimits(s.svc.Rules()), Reload: s.loader.last.get()}
}

// storeHealth is a store's health as the dashboard shows it.
func storeHealth(st any, ready service.Readiness) dashboard.Health {
	var h dashboard.Health
	switch st := st.(type) {
	case *redisstore.Store:
		s := st.Stats()
		h = dashboard.Health{Store: "redis", Breaker: "closed", Calls: s.Calls, Errors: s.Errors, Timeouts: s.Timeouts, Degraded: s.Degraded,
			BreakerOpens: s.BreakerOpens, TimeoutMS: float64(s.Timeout) / 1e6, LagMS: float64(s.Lag) / 1e6}
		if s.Breaker {
			h.Breaker = "open"
		}
	case *memstore.Store:
		s := st.Stats()
		h = dashboard.Health{Store: "memory", Keys: s.Keys, Bytes: s.Bytes, Refused: s.Refused, Degraded: s.Refused}
	default:
		h.Store = fmt.Sprintf("%T", st)
	}
	if ready != nil {
		h.Ready, h.ReadyText = ready()
	}
	return h
}

// dashboardLimits are cfg's limits, each with its file:line.
func dashboardLimits(cfg *rules.Config) []dashboard.Limit {
	out := []dashboard.Limit{}
	if cfg == nil {
		return out
	}
	for _, d := range cfg.Domains() {
		for _, l := range d.Limits() {
			dl := dashboard.Limit{Domain: d.Name, Name: l.Name, File: l.File, Line: l.Line}
			switch {
			case l.Unlimited:
				dl.Text = "unlimited"
			case l.Blocked:
				dl.Text = "blocked: every request refused"
			default:
				dl.Text = fmt.Sprintf("%d per %s", l.RequestsPerUnit, l.Window)
			}
			switch {
			case l.ShadowMode:
				dl.Mode = "shadow"
			case l.QuotaMode:
				dl.Mode = "quota"
			}
			out = append(out, dl)
		}
	}
	return out
}

var _ http.Handler = (*dashboard.Dashboard)(nil)

// proxyDashboard is what floodgate proxy keeps for its dashboard: the
// decisions of its http routes per second and their top limited keys.
// Its dashboard shows those and the store's health; the key inspector,
// the overrides editor and the rules panel are serve's.
type proxyDashboard struct {
	rec     *recorder.Recorder
	limited *topk.Rules
	store   any
	ready   service.Readiness
}

// newProxyDashboard returns the proxy's recorder and summaries, nil with
// --no-dashboard.
// Its tracks are the store's tiers (on Redis) and th's shed requests (with
// a throttler).
func newProxyDashboard(c *proxyConfig, st *openedStore, th *throttle.Throttler) *proxyDashboard {
	if c.noDashboard {
		return nil
	}
	pd := &proxyDashboard{rec: recorder.New(), limited: topk.NewRules(service.LimitedSlots, service.LimitedRules), store: st.store, ready: st.ready}
	trackTiers(pd.rec, st.store)
	trackShed(pd.rec, th)
	return pd
}

// onVerdict counts a gate verdict's decided outcomes (internal/proxy's
// Config.OnVerdict): per route, allowed, refused (over the limit, or
// banned), shadow-refused, degraded, warned; and the keys over a limit.
func (pd *proxyDashboard) onVerdict(v *gate.Verdict) {
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		if !o.Decided() && !o.Banned {
			continue
		}
		refused := o.Over || o.Banned
		shadow := !refused && !o.Decision.Allowed
		id := recorder.ID{Domain: o.Limit.Domain, Rule: o.Limit.Name}
		pd.rec.For(o.Limit, id).Record(!refused && !shadow, shadow, o.Decision.Degraded, o.Decision.Excess)
		if refused || shadow {
			pd.limited.Add(topk.RuleID{Domain: id.Domain, Rule: id.Rule}, decide.BoundKey(o.Key))
		}
	}
}

// prune drops the top keys of routes a reload removed.
func (pd *proxyDashboard) prune(cfg *rules.Config) {
	limits, err := gate.FromRules(cfg)
	if err != nil {
		return
	}
	live := map[topk.RuleID]bool{}
	for _, l := range limits {
		live[topk.RuleID{Domain: l.Domain, Rule: l.Name}] = true
	}
	pd.limited.Prune(func(id topk.RuleID) bool { return live[id] })
}

func (pd *proxyDashboard) Series(since int64) ([]recorder.Series, recorder.Latency, int64) {
	return pd.rec.Since(since)
}

func (pd *proxyDashboard) Tracks(since, upto int64) []recorder.TrackSeries {
	return pd.rec.Tracks(since, upto)
}

func (pd *proxyDashboard) Top(n int) []service.TopRule {
	return service.TopRules(pd.limited, "", "", n)
}

func (pd *proxyDashboard) Health() dashboard.Health { return storeHealth(pd.store, pd.ready) }

func (pd *proxyDashboard) Rules() *dashboard.Rules { return nil }
