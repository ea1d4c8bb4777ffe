package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/overrides"
)

const overridesUsage = `usage: floodgate overrides get|set|delete|list|import|export [flags]

Per-key overrides of a domain's limits, on serve's admin API. KEY is the
store key of a descriptor as inspect and list show it: user=241531, and
route=r1|user=241531 for a nested one ('%', '=', '|' and '*' inside keys
and values written %25, %3D, %7C and %2A).

  floodgate overrides get    --domain D KEY
  floodgate overrides set    --domain D KEY --limit N --period 1s [--burst N] [--algorithm A] [--note TEXT]
  floodgate overrides delete --domain D KEY
  floodgate overrides list   --domain D [--after KEY] [--limit N] [--json]
  floodgate overrides export [--domain D]... [-o FILE]   JSON lines, every override (default: of every live domain)
  floodgate overrides import FILE [--domain D] [--dry-run]   JSON lines as export writes them

floodgate help overrides SUBCOMMAND shows a subcommand's flags.
`

// overridesCommand is `floodgate overrides SUBCOMMAND`.
func overridesCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, overridesUsage+"\n"+exitCodesHelp)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "get", "set", "delete", "list", "export", "import":
	case "-h", "--help", "help":
		if len(rest) > 0 {
			return overridesCommand([]string{rest[0], "-h"}, stdout, stderr)
		}
		fmt.Fprint(stderr, overridesUsage+"\n"+exitCodesHelp)
		return exitOK
	default:
		fmt.Fprintf(stderr, "floodgate overrides: unknown subcommand %q\n\n%s", sub, overridesUsage)
		return exitUsage
	}
	o := &overridesCmd{name: "overrides " + sub, stdout: stdout, stderr: stderr}
	fs := o.flags(sub)
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		return flagExit(err)
	}
	o.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.given[f.Name] = true })
	return exitWith(stderr, o.name, o.run(sub, pos))
}

// overridesCmd is one overrides subcommand's flags and output.
type overridesCmd struct {
	name           string
	af             adminFlags
	domain         string
	domains        multiFlag // export's --domain, repeatable
	after          string
	limit          int
	set            overrides.Override
	period         time.Duration
	algorithm      string
	out            string
	dryRun         bool
	given          map[string]bool // the flags given
	stdout, stderr io.Writer
	c              *adminClient
}

// flags makes the flag set of subcommand sub.
func (o *overridesCmd) flags(sub string) *flag.FlagSet {
	fs := flag.NewFlagSet(o.name, flag.ContinueOnError)
	fs.SetOutput(o.stderr)
	usage := "usage: floodgate overrides " + sub
	switch sub {
	case "get", "delete":
		fs.StringVar(&o.domain, "domain", "", "the rules domain (required)")
		usage += " --domain D [flags] KEY\n\nflags:\n"
	case "set":
		fs.StringVar(&o.domain, "domain", "", "the rules domain (required)")
		fs.Int64Var(&o.set.Limit, "limit", 0, "requests per --period (required)")
		fs.DurationVar(&o.period, "period", 0, "the window or refill period, e.g. 1s, 1m, 24h (required)")
		fs.Int64Var(&o.set.Burst, "burst", 0, "a bucket's capacity (0: the limit)")
		fs.StringVar(&o.algorithm, "algorithm", "", "replace the rule's algorithm: token_bucket, gcra, fixed_window, sliding_window, ...")
		fs.StringVar(&o.set.Note, "note", "", "free text: why, who, until when")
		usage += " --domain D --limit N --period DURATION [flags] KEY\n\nflags:\n"
	case "list":
		fs.StringVar(&o.domain, "domain", "", "the rules domain (required)")
		fs.StringVar(&o.after, "after", "", "start after this key (keys are listed in byte order)")
		fs.IntVar(&o.limit, "limit", 0, "list at most this many (default: all, page by page)")
		usage += " --domain D [flags]\n\nflags:\n"
	case "export":
		fs.Var(&o.domains, "domain", "a domain to export (repeat for several; default: every domain of the live rules)")
		fs.StringVar(&o.out, "o", "-", "write to this file (- for stdout)")
		usage += " [--domain D]... [-o FILE] [flags]\n\nWrites every override as JSON lines, one object a line, as import reads them.\n\nflags:\n"
	case "import":
		fs.StringVar(&o.domain, "domain", "", "the domain of lines that name none; a line naming another domain is an error")
		fs.BoolVar(&o.dryRun, "dry-run", false, "check the whole file, locally and on the server, and write nothing")
		usage += importUsage
	}
	o.af.register(fs, sub == "list" || sub == "get")
	fs.Usage = adminUsage(fs, o.stderr, usage)
	return fs
}

// run runs subcommand sub with its positional arguments.
func (o *overridesCmd) run(sub string, pos []string) error {
	if sub == "import" {
		return o.importFile(pos) // checks the file before making a client
	}
	var err error
	if o.c, err = o.af.client(); err != nil {
		return err
	}
	switch sub {
	case "get", "set", "delete":
		if o.domain == "" || len(pos) != 1 || pos[0] == "" {
			return usageError(fmt.Errorf("want --domain D and one KEY (the store key, e.g. user=241531); see floodgate help overrides %s", sub))
		}
		return map[string]func(string) error{"get": o.get, "set": o.put, "delete": o.delete}[sub](pos[0])
	case "list":
		if o.domain == "" || len(pos) > 0 {
			return usageError(errors.New("want --domain D and no other argument; see floodgate help overrides list"))
		}
		return o.list()
	}
	if len(pos) > 0 {
		return usageError(fmt.Errorf("unexpected argument %q", pos[0]))
	}
	return o.export()
}

// overridePath is the URL path of one override, each part escaped once.
func overridePath(domain, key string) string {
	return "/v1/overrides/" + url.PathEscape(domain) + "/" + url.PathEscape(key)
}

func (o *overridesCmd) get(key string) error {
	var got overrides.Override
	if err := o.c.call(context.Background(), "GET", overridePath(o.domain, key), nil, nil, &got); err != nil {
		return err
	}
	if o.af.json {
		printJSON(o.stdout, got)
		return nil
	}
	printOverrides(o.stdout, []overrides.Override{got})
	return nil
}

func (o *overridesCmd) put(key string) error {
	if !o.given["limit"] || !o.given["period"] {
		return usageError(errors.New("--limit and --period are required"))
	}
	v := o.set
	v.Domain, v.Key, v.Period, v.Algorithm = o.domain, key, o.period, floodgate.Algorithm(o.algorithm)
	if err := v.Validate(); err != nil {
		return usageError(flagFieldError(err))
	}
	var got overrides.Override
	if err := o.c.call(context.Background(), "PUT", overridePath(o.domain, key), nil, v, &got); err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "set %s %s: %s\n", got.Domain, got.Key, overrideNumbers(got))
	return nil
}

// flagFieldError names the flag of an override's bad field.
func flagFieldError(err error) error {
	var fe *overrides.FieldError
	if errors.As(err, &fe) {
		return fmt.Errorf("--%s: %s", fe.Field, fe.Msg)
	}
	return err
}

func (o *overridesCmd) delete(key string) error {
	if err := o.c.call(context.Background(), "DELETE", overridePath(o.domain, key), nil, nil, nil); err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "deleted %s %s\n", o.domain, key)
	return nil
}

func (o *overridesCmd) list() error {
	if o.limit < 0 {
		return usageError(fmt.Errorf("--limit %d: want 1 or more (0: all)", o.limit))
	}
	var all []overrides.Override
	err := o.pages(o.domain, o.after, o.limit, func(page []overrides.Override) error {
		all = append(all, page...)
		return nil
	})
	if err != nil {
		return err
	}
	if o.af.json {
		if all == nil {
			all = []overrides.Override{}
		}
		printJSON(o.stdout, all)
		return nil
	}
	printOverrides(o.stdout, all)
	return nil
}

// pages lists domain's overrides after after, max of them (0: all), a page
// at a time (GET /v1/overrides/{domain}?after=&limit=), calling f with each.
func (o *overridesCmd) pages(domain, after string, max int, f func([]overrides.Override) error) error {
	for n := 0; max == 0 || n < max; {
		size := overrides.MaxListLimit
		if max > 0 {
			size = min(size, max-n)
		}
		q := url.Values{"limit": {fmt.Sprint(size)}}
		if after != "" {
			q.Set("after", after)
		}
		var page []overrides.Override
		if err := o.c.call(context.Background(), "GET", "/v1/overrides/"+url.PathEscape(domain), q, nil, &page); err != nil {
			return err
		}
		if err := f(page); err != nil {
			return err
		}
		n += len(page)
		if len(page) < size {
			return nil
		}
		after = page[len(page)-1].Key
	}
	return nil
}

// printOverrides prints overrides as a table.
func printOverrides(w io.Writer, list []overrides.Override) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tKEY\tLIMIT\tPERIOD\tBURST\tALGORITHM\tUPDATED\tNOTE")
	for _, o := range list {
		burst := "-"
		if o.Burst > 0 {
			burst = fmt.Sprint(o.Burst)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", o.Domain, o.Key, o.Limit, o.Period, burst,
			dash(string(o.Algorithm)), o.Updated.UTC().Format(time.RFC3339), oneLine(o.Note))
	}
	tw.Flush()
}

// oneLine keeps a note on its table row.
func oneLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\t", " ", "\r", `\r`).Replace(s)
}

// overrideNumbers is "5 per 1s (burst 10, gcra)".
func overrideNumbers(o overrides.Override) string {
	s := fmt.Sprintf("%d per %s", o.Limit, o.Period)
	var extra []string
	if o.Burst > 0 {
		extra = append(extra, fmt.Sprintf("burst %d", o.Burst))
	}
	if o.Algorithm != "" {
		extra = append(extra, string(o.Algorithm))
	}
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}

// liveDomains lists the domains of the live rules (GET /v1/rules).
func (o *overridesCmd) liveDomains() ([]string, error) {
	var live struct {
		Domains []struct {
			Domain string `json:"domain"`
		} `json:"domains"`
	}
	if err := o.c.call(context.Background(), "GET", "/v1/rules", nil, nil, &live); err != nil {
		return nil, err
	}
	var out []string
	for _, d := range live.Domains {
		out = append(out, d.Domain)
	}
	return out, nil
}

// writeJSONLine writes v as one line of JSON.
func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
