package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/floodgate/floodgate/service"
)

// topAnswer is GET /v1/top's answer: per rule, the keys most often over
// its limit, by the service's heavy-hitter summary (a count and how much
// it may overstate).
type topAnswer struct {
	Rules []topRule `json:"rules"`
}

type topRule struct {
	Domain string   `json:"domain"`
	Rule   string   `json:"rule"`
	Keys   []topKey `json:"keys"`
}

type topKey struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

const topUsage = `usage: floodgate top [--domain D] [--rule R] [-n N] [--watch | --interval 2s] [flags]

The keys most often over each rule's limit (refused, or in shadow or quota
mode would have been), by the service's bounded heavy-hitter summary
(GET /v1/top on serve's admin API; 256 keys kept a rule): COUNT is the
key's decisions over the limit, an estimate that may overstate them by
ERROR (the true count is between COUNT-ERROR and COUNT), never understate. Once by default; with --watch (or --interval) it refreshes like
top: on a terminal the screen is cleared and redrawn, otherwise each
refresh is printed as its own block (with --json, one JSON document a
line). It runs until interrupted (Ctrl-C), or for --count refreshes.

  floodgate top
  floodgate top --domain api --rule per_user -n 20 --watch
  floodgate top --json --interval 5s --count 12 > top.jsonl

flags:
`

// topCmd is `floodgate top`'s flags.
type topCmd struct {
	af           adminFlags
	domain, rule string
	n            int
	watch        bool
	interval     time.Duration
	count        int
}

// topCommand is `floodgate top`.
func topCommand(args []string, stdout, stderr io.Writer) int {
	t := &topCmd{}
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&t.domain, "domain", "", "only this domain's rules")
	fs.StringVar(&t.rule, "rule", "", "only the rule of this name")
	fs.IntVar(&t.n, "n", 10, "keys a rule (at most 100)")
	fs.BoolVar(&t.watch, "watch", false, "refresh every --interval until interrupted")
	fs.DurationVar(&t.interval, "interval", 2*time.Second, "time between refreshes (implies --watch)")
	fs.IntVar(&t.count, "count", 0, "with --watch, stop after this many refreshes (0: until interrupted)")
	t.af.register(fs, true)
	fs.Usage = adminUsage(fs, stderr, topUsage)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return flagExit(err)
	}
	fs.Visit(func(f *flag.Flag) { t.watch = t.watch || f.Name == "interval" || f.Name == "count" })
	switch {
	case len(pos) > 0:
		return exitWith(stderr, "top", usageError(fmt.Errorf("unexpected argument %q", pos[0])))
	case t.n < 1 || t.n > service.MaxTopKeys:
		return exitWith(stderr, "top", usageError(fmt.Errorf("-n %d: want 1 to %d", t.n, service.MaxTopKeys)))
	case t.interval <= 0:
		return exitWith(stderr, "top", usageError(fmt.Errorf("--interval %v: want more than 0", t.interval)))
	case t.count < 0:
		return exitWith(stderr, "top", usageError(fmt.Errorf("--count %d: want 0 or more", t.count)))
	}
	c, err := t.af.client()
	if err != nil {
		return exitWith(stderr, "top", err)
	}
	if !t.watch {
		ans, err := t.fetch(context.Background(), c)
		if err != nil {
			return exitWith(stderr, "top", err)
		}
		if t.af.json {
			return printJSON(stdout, ans)
		}
		t.printTable(stdout, c, ans, time.Now())
		return exitOK
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return exitWith(stderr, "top", t.loop(ctx, c, stdout, stderr, isTerminal(stdout)))
}

// fetch asks for one snapshot.
func (t *topCmd) fetch(ctx context.Context, c *adminClient) (topAnswer, error) {
	q := url.Values{"n": {fmt.Sprint(t.n)}}
	if t.domain != "" {
		q.Set("domain", t.domain)
	}
	if t.rule != "" {
		q.Set("rule", t.rule)
	}
	var ans topAnswer
	err := c.call(ctx, "GET", "/v1/top", q, nil, &ans)
	return ans, err
}

// loop refreshes every interval until ctx ends or count refreshes are
// done. A server that stops answering (a restart) or fails a call is
// reported on stderr and asked again at the next refresh (the last
// refresh's failure is loop's); a refusal (401, 404, 400) ends it.
func (t *topCmd) loop(ctx context.Context, c *adminClient, stdout, stderr io.Writer, term bool) error {
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for i := 1; ; i++ {
		err := t.refresh(ctx, c, stdout, term)
		switch {
		case ctx.Err() != nil:
			return nil // interrupted
		case err != nil && !retryable(err):
			return err
		case t.count > 0 && i >= t.count:
			return err
		case err != nil:
			fmt.Fprintf(stderr, "floodgate top: %v (asking again every %s)\n", err, t.interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// retryable reports whether a refresh's failure may pass: no answer, or a
// server error.
func retryable(err error) bool {
	ae, ok := errors.AsType[*adminError](err)
	return ok && (ae.code == exitUnreachable || ae.code == exitServer)
}

// refresh fetches and prints one view: on a terminal it first clears the
// screen; otherwise a table is a block ending in a blank line, JSON a line.
func (t *topCmd) refresh(ctx context.Context, c *adminClient, stdout io.Writer, term bool) error {
	ans, err := t.fetch(ctx, c)
	if err != nil {
		return err
	}
	var view bytes.Buffer
	if term {
		view.WriteString("\x1b[H\x1b[2J") // home, clear: redraw in place
	}
	if t.af.json {
		b, _ := json.Marshal(struct {
			Time time.Time `json:"time"`
			topAnswer
		}{time.Now().UTC(), ans})
		view.Write(append(b, '\n'))
	} else {
		t.printTable(&view, c, ans, time.Now())
		if !term {
			view.WriteByte('\n')
		}
	}
	_, err = stdout.Write(view.Bytes())
	return err
}

// printTable writes one snapshot: a header line, then a row per key.
func (t *topCmd) printTable(w io.Writer, c *adminClient, ans topAnswer, now time.Time) {
	fmt.Fprintf(w, "floodgate top  %s  %s", c.base.Host, now.UTC().Format("2006-01-02 15:04:05 UTC"))
	if t.watch {
		fmt.Fprintf(w, "  every %s", t.interval)
	}
	fmt.Fprintln(w)
	if len(ans.Rules) == 0 {
		fmt.Fprintln(w, "no key has been over a limit (of the rules asked for) since the server started")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tRULE\t#\tCOUNT\tERROR\tKEY")
	for _, r := range ans.Rules {
		for i, k := range r.Keys {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", r.Domain, r.Rule, i+1, k.Count, k.Error, oneLine(k.Key))
		}
	}
	tw.Flush()
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
