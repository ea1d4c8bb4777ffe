package rules

import (
	"encoding/json"
	"net/netip"
)

type jsonConfig struct {
	Domains []jsonDomain `json:"domains"`
}

type jsonDomain struct {
	Domain       string      `json:"domain"`
	File         string      `json:"file"`
	AllOrNothing bool        `json:"all_or_nothing,omitempty"`
	Descriptors  []jsonDesc  `json:"descriptors"`
	HTTP         []jsonRoute `json:"http,omitempty"`
}

type jsonRoute struct {
	Name           string         `json:"name"`
	Line           int            `json:"line"`
	Match          *jsonMatch     `json:"match,omitempty"`
	Key            []jsonKeyPart  `json:"key"`
	Action         string         `json:"action"`
	Status         int            `json:"status,omitempty"`
	MaxDelay       string         `json:"max_delay,omitempty"`
	Redirect       string         `json:"redirect,omitempty"`
	RedirectStatus int            `json:"redirect_status,omitempty"`
	Ban            *jsonBan       `json:"ban,omitempty"`
	Cost           int64          `json:"cost"`
	ExemptCIDRs    []netip.Prefix `json:"exempt_cidrs,omitempty"`
	Limit          *jsonLimit     `json:"limit,omitempty"` // the route's own; none when it relies on the descriptors
}

type jsonMatch struct {
	Host       []string `json:"host,omitempty"`
	PathPrefix string   `json:"path_prefix,omitempty"`
	Path       string   `json:"path,omitempty"`
	Methods    []string `json:"methods,omitempty"`
}

type jsonKeyPart struct {
	Kind    string `json:"kind"`
	Name    string `json:"name,omitempty"`
	Entry   string `json:"entry"`
	Missing string `json:"missing,omitempty"`
}

type jsonBan struct {
	Threshold int64  `json:"threshold"`
	Interval  string `json:"interval"`
	Duration  string `json:"duration"`
}

type jsonDesc struct {
	Key            string     `json:"key"`
	Value          string     `json:"value,omitempty"`
	ValuePrefix    string     `json:"value_prefix,omitempty"`
	ValueRegex     string     `json:"value_regex,omitempty"`
	Exempt         bool       `json:"exempt,omitempty"`
	ExemptValues   []string   `json:"exempt_values,omitempty"`
	ShareThreshold bool       `json:"share_threshold,omitempty"`
	ValueToMetric  bool       `json:"value_to_metric,omitempty"`
	Line           int        `json:"line"`
	Limit          *jsonLimit `json:"limit,omitempty"`
	Descriptors    []jsonDesc `json:"descriptors,omitempty"`
}

type jsonLimit struct {
	Name            string         `json:"name"`
	Policy          string         `json:"policy,omitempty"`
	Unlimited       bool           `json:"unlimited,omitempty"`
	Blocked         bool           `json:"blocked,omitempty"`
	ShadowMode      bool           `json:"shadow_mode,omitempty"`
	QuotaMode       bool           `json:"quota_mode,omitempty"`
	DetailedMetric  bool           `json:"detailed_metric,omitempty"`
	Replaces        []string       `json:"replaces,omitempty"`
	Unit            string         `json:"unit,omitempty"`
	RequestsPerUnit uint32         `json:"requests_per_unit"`
	Window          string         `json:"window,omitempty"`
	Metadata        map[string]any `json:"metadata,omitempty"`
	Rules           []ruleInfo     `json:"rules,omitempty"`
	Line            int            `json:"line"`
}

// JSON renders the live rules, for the admin API: every domain (by name)
// with its descriptor tree in file order, its http routes, and each
// limit's rules as the engine runs them.
func (c *Config) JSON() ([]byte, error) {
	out := jsonConfig{Domains: []jsonDomain{}}
	if c != nil {
		for _, d := range c.order {
			out.Domains = append(out.Domains, jsonDomain{Domain: d.Name, File: d.File, AllOrNothing: d.AllOrNothing,
				Descriptors: jsonNodes(d.order), HTTP: jsonRoutes(d.http)})
		}
	}
	return json.MarshalIndent(out, "", "  ")
}

func jsonNodes(ns []*node) []jsonDesc {
	out := make([]jsonDesc, 0, len(ns))
	for _, n := range ns {
		j := jsonDesc{Key: n.key, Exempt: n.exempt, ExemptValues: n.exempts, ShareThreshold: n.share, ValueToMetric: n.toMetric, Line: n.line}
		switch n.kind {
		case kindExact, kindGlob:
			j.Value = n.value
		case kindPrefix:
			j.ValuePrefix = n.value
		case kindRegex:
			j.ValueRegex = n.value
		}
		j.Limit = jsonLimitOf(n.limit)
		if n.children != nil {
			j.Descriptors = jsonNodes(n.order)
		}
		out = append(out, j)
	}
	return out
}

func jsonLimitOf(l *Limit) *jsonLimit {
	if l == nil {
		return nil
	}
	jl := &jsonLimit{Name: l.Name, Unlimited: l.Unlimited, Blocked: l.Blocked, ShadowMode: l.ShadowMode,
		QuotaMode: l.QuotaMode, DetailedMetric: l.DetailedMetric, Replaces: l.Replaces, Unit: l.Unit,
		RequestsPerUnit: l.RequestsPerUnit, Metadata: l.Metadata, Rules: l.rules, Line: l.Line}
	if l.Policy != nil {
		jl.Policy = l.Policy.Name()
	}
	if l.Window > 0 {
		jl.Window = l.Window.String()
	}
	return jl
}

func jsonRoutes(rs []*HTTPRoute) []jsonRoute {
	var out []jsonRoute
	for _, r := range rs {
		j := jsonRoute{Name: r.Name, Line: r.Line, Key: []jsonKeyPart{}, Action: r.Action, Status: r.Status, Redirect: r.Redirect,
			RedirectStatus: r.RedirectStatus, Cost: r.Cost, ExemptCIDRs: r.ExemptCIDRs, Limit: jsonLimitOf(r.Limit)}
		if len(r.Hosts) > 0 || r.PathPrefix != "" || r.Path != "" || len(r.Methods) > 0 {
			j.Match = &jsonMatch{Host: r.Hosts, PathPrefix: r.PathPrefix, Path: r.Path, Methods: r.Methods}
		}
		for _, kp := range r.Key {
			j.Key = append(j.Key, jsonKeyPart(kp))
		}
		if r.MaxDelay > 0 {
			j.MaxDelay = r.MaxDelay.String()
		}
		if r.Ban != (HTTPBan{}) {
			j.Ban = &jsonBan{Threshold: r.Ban.Threshold, Interval: r.Ban.Interval.String(), Duration: r.Ban.Duration.String()}
		}
		out = append(out, j)
	}
	return out
}
