package gate

import (
	"fmt"
	"strings"
)

// Criticalities are the levels a Limit's Criticality may name (package
// throttle's, from the first shed to the last).
var Criticalities = []string{"SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS"}

// Class is what a request's route says before any limit is decided:
// for the server throttler, which admits a request before its quota is
// spent (Classify).
type Class struct {
	// Route names the first limit (in configuration order) whose Match
	// applies to the request, whatever its key; "" for none.
	Route string
	// Criticality is the Criticality of the first matching limit that
	// sets one; "" for none.
	Criticality string
}

// Classify returns r's Class: which limits' Match (hosts, path, methods)
// it meets, regardless of key parts, exemptions and the store. It asks
// the store nothing.
func (g *Gate) Classify(r *Request) Class {
	var c Class
	if len(g.limits) == 0 {
		return c
	}
	host, path := hostOnly(r.host()), r.path()
	see := func(l *limit) bool {
		if !l.match(r, host, path) {
			return false
		}
		if c.Route == "" {
			c.Route = l.Name
		}
		if c.Criticality == "" {
			c.Criticality = l.Criticality
		}
		return c.Criticality != ""
	}
	if g.index == nil {
		for _, l := range g.limits {
			if see(l) {
				break
			}
		}
		return c
	}
	var lb [8][]int
	lists := g.index.lookup(host, path, lb[:0])
	for i := nextCandidate(lists); i >= 0; i = nextCandidate(lists) {
		if see(g.limits[i]) {
			break
		}
	}
	return c
}

// checkCriticality checks a limit's Criticality and spells it as
// Criticalities does ("" stays "").
func (l *limit) checkCriticality() error {
	if l.Criticality == "" {
		return nil
	}
	s := strings.ReplaceAll(strings.ToUpper(strings.TrimSpace(l.Criticality)), "-", "_")
	for _, n := range Criticalities {
		if s == n {
			l.Criticality = n
			return nil
		}
	}
	return fmt.Errorf("criticality: %q is not a level (want one of %s)", l.Criticality, strings.Join(Criticalities, ", "))
}

// TrustedPeer reports whether a connection's peer ("ip:port" or "ip") is
// one of the trusted proxies (Config.ClientIP.TrustedProxies): one whose
// forwarding headers, and criticality header, are believed.
func (g *Gate) TrustedPeer(peer string) bool {
	a := PeerAddr(peer)
	return a.IsValid() && g.cfg.ClientIP.trusted(a)
}
