package gate

import (
	"fmt"

	"github.com/floodgate/floodgate/rules"
)

// FromRules returns the limits that the http sections of cfg's rules files
// declare, for a Config whose Rules is cfg: a route with its own
// rate_limit carries that policy, and the others are decided by their
// domain's descriptors, the route's key parts being the entries. Limits
// are named "domain/route"; two routes whose names meet so ("a/b" of
// domain "x", "b" of domain "x/a") are refused, with both files' lines.
func FromRules(cfg *rules.Config) ([]Limit, error) {
	var out []Limit
	type place struct {
		route, file string
		line        int
	}
	named := map[string]place{}
	for _, d := range cfg.Domains() {
		for _, rt := range d.HTTP() {
			name := d.Name + "/" + rt.Name
			if o, dup := named[name]; dup {
				return nil, fmt.Errorf("%s:%d: http route %s of domain %q is named %q, as route %s at %s:%d is: rename one", rt.File, rt.Line, rt.Name, d.Name, name, o.route, o.file, o.line)
			}
			named[name] = place{rt.Name, rt.File, rt.Line}
			l, ok, err := routeLimit(d.Name, name, rt)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: http route %s: %w", rt.File, rt.Line, rt.Name, err)
			}
			if ok {
				out = append(out, l)
			}
		}
	}
	return out, nil
}

// routeLimit is the limit of route rt of domain, named name; false for
// an unlimited route, which limits nothing.
func routeLimit(domain, name string, rt *rules.HTTPRoute) (Limit, bool, error) {
	l := Limit{
		Name:           name,
		Domain:         domain,
		Match:          Match{Hosts: rt.Hosts, PathPrefix: rt.PathPrefix, Path: rt.Path, Methods: rt.Methods},
		Cost:           rt.Cost,
		Status:         rt.Status,
		MaxDelay:       rt.MaxDelay,
		Redirect:       rt.Redirect,
		RedirectStatus: rt.RedirectStatus,
		Ban:            BanRule{Threshold: rt.Ban.Threshold, Interval: rt.Ban.Interval, Duration: rt.Ban.Duration},
		Defer:          DeferRule{MaxQueue: rt.Defer.MaxQueue, MaxBody: rt.Defer.MaxBody, ResultTTL: rt.Defer.ResultTTL},
		ExemptNets:     rt.ExemptCIDRs,
		Criticality:    rt.Criticality,
		Action:         Deny,
	}
	if rt.Action != "" {
		a, err := ParseAction(rt.Action)
		if err != nil {
			return Limit{}, false, err
		}
		l.Action = a
	}
	if rt.Limit != nil {
		switch {
		case rt.Limit.Unlimited:
			if rt.Criticality != "" {
				return Limit{}, false, fmt.Errorf("criticality %s on an unlimited route would never apply (an unlimited route is no limit to classify requests by): give it a limit, or set the level on a route with one", rt.Criticality)
			}
			return Limit{}, false, nil
		case rt.Limit.Blocked:
			l.Blocked, l.blockedPolicy = true, rt.Limit.Policy
		default:
			l.Policy = rt.Limit.Policy
		}
		if rt.Limit.ShadowMode {
			l.Action = Shadow
		}
	}
	for _, kp := range rt.Key {
		p, err := routePart(kp)
		if err != nil {
			return Limit{}, false, err
		}
		l.Key = append(l.Key, p)
	}
	return l, true, nil
}

// missings reads a key part's missing: (default ip).
var missings = map[string]Missing{"": MissingIP, "ip": MissingIP, "shared": MissingShared, "skip": MissingSkip}

// routePart is the key part kp of a route.
func routePart(kp rules.HTTPKeyPart) (Part, error) {
	kind, ok := partKind(kp.Kind)
	if !ok || kind == PartAll || kind == PartRoute || kind == PartUser {
		return Part{}, fmt.Errorf("unknown key part %q", kp.Kind)
	}
	return Part{Kind: kind, Name: kp.Name, Entry: kp.Entry, Missing: missings[kp.Missing]}, nil
}

// partKind reads a key part's kind by its name (PartKind.String).
func partKind(name string) (PartKind, bool) {
	for i, n := range partNames {
		if n == name {
			return PartKind(i), true
		}
	}
	return 0, false
}
