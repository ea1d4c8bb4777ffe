package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"text/tabwriter"
)

const deadlettersUsage = `usage: floodgate deadletters list|requeue [flags]

The dead letters of floodgate proxy's deferred queues (http routes with
action: defer): requests whose delivery failed --defer-max-deliveries
times (a transport error or a timeout, not the upstream's status), kept
in each queue's dead-letter stream (its newest --defer-max-dead), their
polls answering 502. Requeueing one moves it back onto its queue in one
step: it is delivered again as a fresh request (the same Idempotency-Key,
its attempts counted from zero), and its poll location answers 202
pending again, then its new result. Of two requeues of one id, one moves
it and the other is 404. On proxy's admin API (default --admin
` + defaultProxyAdminURL + `).

  floodgate deadletters list    [--queue NAME] [--limit N] [--json]
  floodgate deadletters requeue --queue NAME ID...   (stops at the first that fails)
  floodgate deadletters requeue --queue NAME --all   every dead letter of the queue now

NAME is the defer route's name as its poll path and the
floodgate_defer_* metrics show it (DOMAIN/ROUTE); ID a dead letter's, as
list shows it (the first half of its poll id).

Exit code 3 (not found) also names no such queue, and no such dead
letter (never dead, requeued already, or dropped past --defer-max-dead).

floodgate help deadletters SUBCOMMAND shows a subcommand's flags.
`

// deadlettersCommand is `floodgate deadletters SUBCOMMAND`.
func deadlettersCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, deadlettersUsage+"\n"+exitCodesHelp)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "list", "requeue":
	case "-h", "--help", "help":
		if len(rest) > 0 {
			return deadlettersCommand([]string{rest[0], "-h"}, stdout, stderr)
		}
		fmt.Fprint(stderr, deadlettersUsage+"\n"+exitCodesHelp)
		return exitOK
	default:
		fmt.Fprintf(stderr, "floodgate deadletters: unknown subcommand %q\n\n%s", sub, deadlettersUsage)
		return exitUsage
	}
	d := &deadlettersCmd{name: "deadletters " + sub, stdout: stdout}
	fs := flag.NewFlagSet(d.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	usage := "usage: floodgate deadletters " + sub
	fs.StringVar(&d.queue, "queue", "", "the deferred queue (the defer route's name, DOMAIN/ROUTE)")
	if sub == "list" {
		fs.Int64Var(&d.limit, "limit", 100, "list at most this many dead letters of each queue, the oldest first (1 to 10000)")
		usage += " [--queue NAME] [--limit N] [flags]\n\nflags:\n"
	} else {
		fs.BoolVar(&d.all, "all", false, "requeue every dead letter of --queue")
		usage += " --queue NAME (ID... | --all) [flags]\n\nflags:\n"
	}
	d.af.registerAt(fs, sub == "list", defaultProxyAdminURL)
	fs.Usage = adminUsage(fs, stderr, usage)
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		return flagExit(err)
	}
	if sub == "list" {
		err = d.list(pos)
	} else {
		err = d.requeue(pos)
	}
	return exitWith(stderr, d.name, err)
}

// deadlettersCmd is one deadletters subcommand's flags and output.
type deadlettersCmd struct {
	name   string
	af     adminFlags
	queue  string
	limit  int64
	all    bool
	stdout io.Writer
}

// deadLettersAnswer is GET /v1/deadletters's answer.
type deadLettersAnswer struct {
	Queues []deadLettersJSON `json:"queues"`
}

func (d *deadlettersCmd) list(pos []string) error {
	if len(pos) > 0 {
		return usageError(fmt.Errorf("unexpected argument %q; see floodgate help deadletters list", pos[0]))
	}
	if d.limit < 1 || d.limit > 10000 {
		return usageError(fmt.Errorf("--limit %d: want 1 to 10000", d.limit))
	}
	c, err := d.af.client()
	if err != nil {
		return err
	}
	q := url.Values{"limit": {strconv.FormatInt(d.limit, 10)}}
	if d.queue != "" {
		q.Set("queue", d.queue)
	}
	var ans deadLettersAnswer
	if err := c.call(context.Background(), "GET", "/v1/deadletters", q, nil, &ans); err != nil {
		return err
	}
	if d.af.json {
		printJSON(d.stdout, ans)
		return nil
	}
	if len(ans.Queues) == 0 {
		fmt.Fprintln(d.stdout, "no deferred queues (no http route with action: defer)")
		return nil
	}
	tw := tabwriter.NewWriter(d.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tID\tMETHOD\tURL")
	for _, qa := range ans.Queues {
		for _, l := range qa.Letters {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", qa.Queue, l.ID, l.Method, l.URL)
		}
	}
	tw.Flush()
	for _, qa := range ans.Queues {
		fmt.Fprintf(d.stdout, "%s: %d dead letters", qa.Queue, qa.Dead)
		if int64(len(qa.Letters)) < qa.Dead {
			fmt.Fprintf(d.stdout, " (the oldest %d shown; --limit)", len(qa.Letters))
		}
		fmt.Fprintln(d.stdout)
	}
	return nil
}

func (d *deadlettersCmd) requeue(ids []string) error {
	if d.queue == "" || d.all == (len(ids) > 0) {
		return usageError(errors.New("want --queue NAME and either IDs or --all; see floodgate help deadletters requeue"))
	}
	c, err := d.af.client()
	if err != nil {
		return err
	}
	if d.all {
		var ans requeuedJSON
		if err := c.call(context.Background(), "POST", "/v1/deadletters/requeue", nil, requeueJSON{Queue: d.queue, All: true}, &ans); err != nil {
			return err
		}
		fmt.Fprintf(d.stdout, "requeued %d dead letters of %s\n", ans.Requeued, ans.Queue)
		return nil
	}
	for _, id := range ids {
		var ans requeuedJSON
		if err := c.call(context.Background(), "POST", "/v1/deadletters/requeue", nil, requeueJSON{Queue: d.queue, ID: id}, &ans); err != nil {
			return err
		}
		fmt.Fprintf(d.stdout, "requeued %s %s\n", ans.Queue, id)
	}
	return nil
}
