package gate

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
)

// compile checks a Limit and derives what deciding it needs, phase by
// phase; the first error names the field.
func (g *Gate) compile(src *Limit) (*limit, error) {
	cp := *src
	l := &limit{Limit: &cp}
	if err := l.validate(); err != nil {
		return nil, err
	}
	if err := l.checkCriticality(); err != nil {
		return nil, err
	}
	if err := g.checkPolicy(l); err != nil {
		return nil, err
	}
	if err := g.compileAction(l); err != nil {
		return nil, err
	}
	if err := l.compileKey(); err != nil {
		return nil, err
	}
	if err := l.compileMatch(); err != nil {
		return nil, err
	}
	l.compileExempt()
	l.compileNames()
	return l, nil
}

// validate checks the limit's name, cost and status, setting defaults.
func (l *limit) validate() error {
	if l.Name == "" {
		return errors.New("name: empty")
	}
	if l.Cost == 0 {
		l.Cost = 1
	}
	if l.Cost < 0 {
		return fmt.Errorf("cost: %d is negative", l.Cost)
	}
	if l.Status == 0 {
		l.Status = http.StatusTooManyRequests
	}
	if l.Status < 400 || l.Status > 599 {
		return fmt.Errorf("status: %d is not an error status (400-599)", l.Status)
	}
	return nil
}

// checkPolicy checks that something decides the limit: the remote
// service, Blocked, its Policy, or its Domain's rules.
func (g *Gate) checkPolicy(l *limit) error {
	switch {
	case g.cfg.Remote != nil, l.Blocked:
	case l.Policy != nil:
	case l.Domain != "":
		if g.cfg.Rules == nil || g.cfg.Rules.Domain(l.Domain) == nil {
			return fmt.Errorf("domain: no rules for domain %q", l.Domain)
		}
	default:
		return errors.New("policy: none (set Policy, or Domain with Config.Rules, or Config.Remote)")
	}
	return nil
}

// actionSpec is what an action asks of a limit: the in-process engine
// (refused with Config.Remote), and its own fields, checked (and
// compiled) by fields.
type actionSpec struct {
	local  bool
	fields func(l *limit) error
}

// actionSpecs are the actions' specs, by Action.
var actionSpecs = [...]actionSpec{
	Deny:     {},
	Ban:      {local: true, fields: (*limit).compileBan},
	Delay:    {local: true, fields: (*limit).checkDelay},
	Redirect: {fields: (*limit).checkRedirect},
	Shadow:   {},
	Defer:    {fields: (*limit).checkDefer},
}

// checkDefer checks a Defer action's policy (which paces its deliveries)
// and bounds.
func (l *limit) checkDefer() error {
	if l.Policy == nil {
		return errors.New("action: defer needs the limit's own policy (a rules file route's own rate_limit): its rate paces the queued requests' delivery")
	}
	if d := l.Defer; d.MaxQueue < 0 || d.MaxBody < 0 || d.ResultTTL < 0 {
		return errors.New("defer: negative bound")
	}
	return nil
}

// compileAction checks the limit's action and the fields it reads.
func (g *Gate) compileAction(l *limit) error {
	if int(l.Action) >= len(actionSpecs) {
		return fmt.Errorf("action: unknown action %d", l.Action)
	}
	spec := actionSpecs[l.Action]
	if spec.local && g.cfg.Remote != nil {
		return fmt.Errorf("action: %s needs the in-process engine, not a remote service", l.Action)
	}
	if spec.fields == nil {
		return nil
	}
	return spec.fields(l)
}

// checkDelay checks a Delay action's MaxDelay and policy.
func (l *limit) checkDelay() error {
	if l.MaxDelay <= 0 {
		return errors.New("max_delay: a delay action needs a positive MaxDelay")
	}
	if l.Policy != nil && !l.Policy.CanDelay() {
		return fmt.Errorf("action: delay needs a bucket rule (token bucket, GCRA, leaky bucket); policy %q has windows only, which never delay: every request over it would be refused", l.Policy.Name())
	}
	return nil
}

// checkRedirect checks a Redirect action's URL and status.
func (l *limit) checkRedirect() error {
	if l.Redirect == "" {
		return errors.New("redirect: a redirect action needs a URL")
	}
	if l.RedirectStatus == 0 {
		l.RedirectStatus = http.StatusFound
	}
	switch l.RedirectStatus {
	case 301, 302, 303, 307, 308:
		return nil
	}
	return fmt.Errorf("redirect_status: %d is not a redirect", l.RedirectStatus)
}

// compileBan checks a Ban action's rule and makes its two policies.
func (l *limit) compileBan() error {
	b := l.Ban
	if b.Threshold < 1 || b.Interval < time.Second || b.Duration < time.Second {
		return errors.New("ban: threshold must be at least 1, interval and duration at least 1s")
	}
	grains := int64((b.Interval + b.Duration + banGrain - 1) / banGrain)
	var err error
	// The marker: a bucket refilling one grain per grain; a ban of k
	// grains empties k, and the key is free when it is full again.
	l.banMarker, err = floodgate.NewPolicy(l.Name+".ban", floodgate.Rule{Name: "ban", Algorithm: floodgate.TokenBucket, Limit: 1, Period: banGrain, Burst: grains})
	if err != nil {
		return fmt.Errorf("ban: %w", err)
	}
	// The threshold: a fixed window admitting one more than the
	// threshold, so that exactly one request per window (the one that
	// fills it) crosses, atomically in the store.
	l.banThresh, err = floodgate.NewPolicy(l.Name+".ban-threshold", floodgate.Rule{Name: "threshold", Algorithm: floodgate.FixedWindow, Limit: b.Threshold + 1, Period: b.Interval})
	if err != nil {
		return fmt.Errorf("ban: %w", err)
	}
	l.banBurst = grains
	return nil
}

// compileKey checks the key's parts and compiles them.
func (l *limit) compileKey() error {
	if len(l.Key) == 0 {
		l.Key = []Part{All()}
	}
	if len(l.Key) > maxKeyParts {
		return fmt.Errorf("key: %d parts; at most %d", len(l.Key), maxKeyParts)
	}
	seen := map[string]bool{}
	for i, p := range l.Key {
		if p.Kind > PartConst {
			return fmt.Errorf("key[%d]: unknown kind %d", i, p.Kind)
		}
		if (p.Kind == PartHeader || p.Kind == PartCookie || p.Kind == PartQuery) && p.Name == "" {
			return fmt.Errorf("key[%d]: a %s part needs a name", i, p.Kind)
		}
		cp := compilePart(p)
		if seen[cp.entry] {
			return fmt.Errorf("key[%d]: entry %q used twice", i, cp.entry)
		}
		seen[cp.entry] = true
		l.parts = append(l.parts, cp)
	}
	return nil
}

// compileMatch checks the Match and compiles its hosts, path and methods.
func (l *limit) compileMatch() error {
	for _, h := range l.Match.Hosts {
		l.hosts = append(l.hosts, matchHost(h))
	}
	if p := l.Match.Path; p != "" {
		if p[0] != '/' {
			return fmt.Errorf("match.path: %q does not start with /", p)
		}
		if strings.HasSuffix(p, "/**") {
			l.pathRest, p = true, strings.TrimSuffix(p, "/**")
		}
		l.pathSegs = strings.Split(p, "/")
	}
	if l.Match.PathPrefix != "" && l.Match.PathPrefix[0] != '/' {
		return fmt.Errorf("match.path_prefix: %q does not start with /", l.Match.PathPrefix)
	}
	for _, m := range l.Match.Methods {
		l.methods = append(l.methods, strings.ToUpper(m))
	}
	return nil
}

// compileExempt sets the exempt keys.
func (l *limit) compileExempt() {
	if len(l.ExemptKeys) == 0 {
		return
	}
	l.exempt = make(map[string]bool, len(l.ExemptKeys))
	for _, k := range l.ExemptKeys {
		l.exempt[k] = true
	}
}

// compileNames sets the names the RateLimit fields give the limit and
// its rules, and, with a Policy, its RateLimit-Policy item.
func (l *limit) compileNames() {
	l.sfName = sfName(l.Name)
	if l.Blocked {
		l.blockedLm = &rules.Limit{Name: l.Name, Blocked: true, Policy: l.blockedPolicy}
	}
	if l.Policy == nil {
		return
	}
	l.ruleNames = map[string]string{}
	rs := l.Policy.Rules()
	var items []string
	for _, r := range rs {
		name := l.Name
		if len(rs) > 1 {
			name += "/" + r.Name
		}
		sf := sfName(name)
		l.ruleNames[r.Name] = sf
		items = append(items, policyItem(sf, r))
	}
	l.policyItems = items
	l.policyItem = []string{strings.Join(items[:min(len(items), maxPolicyItems)], ", ")}
}
