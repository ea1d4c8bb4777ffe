package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// keyState is POST /v1/keys/inspect's and /v1/keys/reset's answer: the
// state of a key under the limit its descriptor matches.
type keyState struct {
	Descriptor string `json:"descriptor"` // the entries asked about, key=value,key2=value2 (the command's, not the server's)
	Limit      string `json:"limit"`
	Key        string `json:"key"`
	Allowed    bool   `json:"allowed"`
	Remaining  int64  `json:"remaining"`
	ResetAfter string `json:"reset_after,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	Rule       string `json:"rule,omitempty"`
	Degraded   bool   `json:"degraded,omitempty"`
	Override   bool   `json:"override"`
	Blocked    bool   `json:"blocked,omitempty"`
}

// keyAnswer reads an inspect or reset answer: one limit's state (today's
// admin API), or a list of them under "limits" (each limit a descriptor
// matches, should the API give several).
type keyAnswer []keyState

// UnmarshalJSON takes either form.
func (a *keyAnswer) UnmarshalJSON(b []byte) error {
	var many struct {
		Limits []keyState `json:"limits"`
	}
	if err := json.Unmarshal(b, &many); err == nil && many.Limits != nil {
		*a = many.Limits
		return nil
	}
	var one keyState
	if err := json.Unmarshal(b, &one); err != nil {
		return err
	}
	*a = keyAnswer{one}
	return nil
}

const inspectUsage = `usage: floodgate inspect --domain D [flags] key=value... [--descriptor k=v,k2=v2]...

Shows the state of a descriptor's key under the limit it matches, and the
decision the next request of cost 1 would get, consuming nothing
(POST /v1/keys/inspect on serve's admin API): a row for each descriptor.
key=value... is one descriptor, its entries in order (route=r1 user=241531
for a nested one); --descriptor adds others, as a request carries several.
A descriptor no limit matches is named on stderr (exit 3), the others shown.

  floodgate inspect --domain api user=241531
  floodgate inspect --domain api remote_address=10.0.0.1 --descriptor remote_address=10.0.0.1,path=/login
  floodgate inspect --admin https://rl.internal:6070 --ca ca.pem --domain api --json user=241531

flags:
`

const resetUsage = `usage: floodgate reset --domain D [flags] key=value... [--descriptor k=v,k2=v2]...

Forgets a descriptor's key under the limit it matches: its next request
finds a fresh state (POST /v1/keys/reset on serve's admin API). A key with
an override is reset under its override. key=value... and --descriptor as
for inspect.

  floodgate reset --domain api user=241531

flags:
`

// inspectCommand is `floodgate inspect`.
func inspectCommand(args []string, stdout, stderr io.Writer) int {
	return keyCommand("inspect", "/v1/keys/inspect", inspectUsage, args, stdout, stderr)
}

// resetCommand is `floodgate reset`.
func resetCommand(args []string, stdout, stderr io.Writer) int {
	return keyCommand("reset", "/v1/keys/reset", resetUsage, args, stdout, stderr)
}

// keyCommand runs inspect or reset: one call of path for each
// descriptor, the answers printed as a table or JSON. A descriptor no
// limit matches is reported on stderr and the others still shown; the
// exit code is then exitNotFound.
func keyCommand(name, path, usage string, args []string, stdout, stderr io.Writer) int {
	var af adminFlags
	var domain string
	var more multiFlag
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&domain, "domain", "", "the rules domain (required)")
	fs.Var(&more, "descriptor", "another descriptor, key=value[,key2=value2...] (repeat for several: a request's descriptors)")
	af.register(fs, true)
	fs.Usage = adminUsage(fs, stderr, usage)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagExit(err)
	}
	if domain == "" {
		return exitWith(stderr, name, usageError(fmt.Errorf("--domain is required (see floodgate help %s)", name)))
	}
	descs, err := descriptors(pos, more)
	if err != nil {
		return exitWith(stderr, name, usageError(err))
	}
	c, err := af.client()
	if err != nil {
		return exitWith(stderr, name, err)
	}
	rows, code := keyCalls(c, name, path, domain, descs, stderr)
	if code != exitOK && code != exitNotFound {
		return code
	}
	switch {
	case af.json:
		if rows == nil {
			rows = keyAnswer{}
		}
		printJSON(stdout, map[string]any{"domain": domain, "limits": rows})
	case name == "reset":
		for _, s := range rows {
			fmt.Fprintf(stdout, "reset %s under limit %s (now: %s)\n", s.Key, s.Limit, decisionText(s))
		}
	case len(rows) > 0:
		printKeyTable(stdout, domain, rows)
	}
	return code
}

// descriptors are the command's descriptors: the key=value arguments (one
// descriptor), then each --descriptor's.
func descriptors(pos []string, more []string) ([][]entry, error) {
	var out [][]entry
	if len(pos) > 0 || len(more) == 0 {
		d, err := parseEntries(pos)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	for _, m := range more {
		d, err := parseEntries(strings.Split(m, ","))
		if err != nil {
			return nil, fmt.Errorf("--descriptor %q: %v", m, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// keyCalls makes the call of each descriptor, in order, and returns the
// states of those a limit matches. A 404 is reported on stderr (the first
// with whether the domain is loaded) and makes the code exitNotFound; any
// other failure ends the calls with its code.
func keyCalls(c *adminClient, name, path, domain string, descs [][]entry, stderr io.Writer) (keyAnswer, int) {
	var rows keyAnswer
	code := exitOK
	for _, d := range descs {
		var ans keyAnswer
		err := c.call(context.Background(), "POST", path, nil, map[string]any{"domain": domain, "entries": d}, &ans)
		ae, _ := err.(*adminError)
		switch {
		case err == nil:
			for i := range ans {
				ans[i].Descriptor = entriesText(d)
			}
			rows = append(rows, ans...)
		case ae != nil && ae.code == exitNotFound:
			if code == exitOK {
				ae.msg += domainHint(c, domain)
			}
			code = exitNotFound
			exitWith(stderr, name, fmt.Errorf("%s: %w", entriesText(d), ae))
		default:
			return nil, exitWith(stderr, name, err)
		}
	}
	return rows, code
}

// entriesText writes a descriptor as key=value,key2=value2.
func entriesText(d []entry) string {
	parts := make([]string, len(d))
	for i, e := range d {
		parts[i] = e.Key + "=" + e.Value
	}
	return strings.Join(parts, ",")
}

// domainHint says, after a 404, whether domain is in the live rules at all
// (it asks GET /v1/rules; nothing when that fails).
func domainHint(c *adminClient, domain string) string {
	var live struct {
		Domains []struct {
			Domain string `json:"domain"`
		} `json:"domains"`
	}
	if c.call(context.Background(), "GET", "/v1/rules", nil, nil, &live) != nil {
		return ""
	}
	var names []string
	for _, d := range live.Domains {
		if d.Domain == domain {
			return fmt.Sprintf("\n  (domain %q is loaded: no limit of it matches these entries, or an entry is exempt)", domain)
		}
		names = append(names, strconv.Quote(d.Domain))
	}
	return fmt.Sprintf("\n  (no domain %q in the live rules; they have %v)", domain, names)
}

// printKeyTable prints inspect's answer, one limit a row.
func printKeyTable(w io.Writer, domain string, ans keyAnswer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tLIMIT\tKEY\tDECISION\tREMAINING\tRULE\tRETRY AFTER\tRESET AFTER\tOVERRIDE")
	for _, s := range ans {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", domain, s.Limit, s.Key, decisionWord(s),
			s.Remaining, dash(s.Rule), dash(zeroDash(s.RetryAfter)), dash(zeroDash(s.ResetAfter)), yesNo(s.Override))
	}
	tw.Flush()
}

// decisionWord is what the next request would get: allow, refuse or
// blocked (requests_per_unit 0), "(degraded)" when the store did not say.
func decisionWord(s keyState) string {
	w := "allow"
	switch {
	case s.Blocked:
		w = "refuse (blocked)"
	case !s.Allowed:
		w = "refuse"
	}
	if s.Degraded {
		w += " (degraded)"
	}
	return w
}

// decisionText is decisionWord with the remaining count.
func decisionText(s keyState) string {
	return fmt.Sprintf("%s, %d remaining", decisionWord(s), s.Remaining)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// zeroDash writes a zero duration as "".
func zeroDash(d string) string {
	if d == "0s" {
		return ""
	}
	return d
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return exitServer
	}
	return exitOK
}
