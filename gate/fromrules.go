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
			l := Limit{
				Name:           name,
				Domain:         d.Name,
				Match:          Match{Hosts: rt.Hosts, PathPrefix: rt.PathPrefix, Path: rt.Path, Methods: rt.Methods},
				Cost:           rt.Cost,
				Status:         rt.Status,
				MaxDelay:       rt.MaxDelay,
				Redirect:       rt.Redirect,
				RedirectStatus: rt.RedirectStatus,
				Ban:            BanRule{Threshold: rt.Ban.Threshold, Interval: rt.Ban.Interval, Duration: rt.Ban.Duration},
				ExemptNets:     rt.ExemptCIDRs,
			}
			a, err := ParseAction(rt.Action)
			if rt.Action == "" {
				a, err = Deny, nil
			}
			if err != nil {
				return nil, fmt.Errorf("%s:%d: http route %s: %w", rt.File, rt.Line, rt.Name, err)
			}
			l.Action = a
			if rt.Limit != nil {
				switch {
				case rt.Limit.Unlimited:
					continue
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
				p := Part{Name: kp.Name, Entry: kp.Entry}
				kind, ok := partKind(kp.Kind)
				if !ok || kind == PartAll || kind == PartRoute || kind == PartUser {
					return nil, fmt.Errorf("%s:%d: http route %s: unknown key part %q", rt.File, rt.Line, rt.Name, kp.Kind)
				}
				p.Kind = kind
				switch kp.Missing {
				case "", "ip":
					p.Missing = MissingIP
				case "shared":
					p.Missing = MissingShared
				case "skip":
					p.Missing = MissingSkip
				}
				l.Key = append(l.Key, p)
			}
			out = append(out, l)
		}
	}
	return out, nil
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
