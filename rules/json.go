package rules

import (
	"encoding/json"
)

type jsonConfig struct {
	Domains []jsonDomain `json:"domains"`
}

type jsonDomain struct {
	Domain       string     `json:"domain"`
	File         string     `json:"file"`
	AllOrNothing bool       `json:"all_or_nothing,omitempty"`
	Descriptors  []jsonDesc `json:"descriptors"`
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
// with its descriptor tree in file order and each limit's rules as the
// engine runs them.
func (c *Config) JSON() ([]byte, error) {
	out := jsonConfig{Domains: []jsonDomain{}}
	if c != nil {
		for _, d := range c.order {
			out.Domains = append(out.Domains, jsonDomain{Domain: d.Name, File: d.File, AllOrNothing: d.AllOrNothing, Descriptors: jsonNodes(d.order)})
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
		if l := n.limit; l != nil {
			jl := &jsonLimit{Name: l.Name, Unlimited: l.Unlimited, Blocked: l.Blocked, ShadowMode: l.ShadowMode,
				QuotaMode: l.QuotaMode, DetailedMetric: l.DetailedMetric, Replaces: l.Replaces, Unit: l.Unit,
				RequestsPerUnit: l.RequestsPerUnit, Metadata: l.Metadata, Rules: l.rules, Line: l.Line}
			if l.Policy != nil {
				jl.Policy = l.Policy.Name()
			}
			if l.Window > 0 {
				jl.Window = l.Window.String()
			}
			j.Limit = jl
		}
		if n.children != nil {
			j.Descriptors = jsonNodes(n.order)
		}
		out = append(out, j)
	}
	return out
}
