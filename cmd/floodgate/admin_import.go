package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/service"
)

const importUsage = ` FILE [--domain D] [--dry-run] [flags]

Reads FILE (- for stdin): JSON lines, one override a line, as export writes
them ({"domain":"api","key":"user=241531","limit":5,"period":"1s"}, with
"burst", "algorithm", "note" and "updated" optional); blank lines and lines
starting with # are skipped. A line's "updated" time is kept.

The whole file is checked before anything is written: every line's fields
(each error named FILE:LINE and the field), a key given twice, and then, on
the server, that each override can apply to the limit its key matches
(PUT /v1/overrides?dry_run=true). One bad line writes nothing. Then the
overrides are written with PUT /v1/overrides, up to 10,000 a call, each
call all or nothing (one bbolt transaction). A file of more than 10,000
takes several calls: should the server fail one (the store down), the calls
before it stand, and import says which lines were written and which were
not. Writing is idempotent: run the import again.

flags:
`

// importLine is one override of an import file and its line number.
type importLine struct {
	line int
	o    overrides.Override
}

// importFile is `overrides import FILE`.
func (o *overridesCmd) importFile(pos []string) error {
	if len(pos) != 1 {
		return usageError(errors.New("want one FILE (- for stdin); see floodgate help overrides import"))
	}
	name := pos[0]
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return usageError(err)
		}
		defer f.Close()
		r = f
	}
	lines, err := readImport(name, r, o.domain)
	if err != nil {
		return err
	}
	if o.c, err = o.af.client(); err != nil {
		return err
	}
	batches := chunk(lines, service.MaxBulkOverrides)
	for _, b := range batches { // the server's checks, for every line, before any is written
		if err := o.bulk(name, b, true); err != nil {
			return err
		}
	}
	if o.dryRun {
		fmt.Fprintf(o.stdout, "%s: %d overrides checked, none written (--dry-run)\n", name, len(lines))
		return nil
	}
	done := 0
	for i, b := range batches {
		if err := o.bulk(name, b, false); err != nil {
			if ae, ok := errors.AsType[*adminError](err); ok {
				ae.msg += partialNote(name, lines, done, i, len(batches))
			}
			return err
		}
		done += len(b)
	}
	fmt.Fprintf(o.stdout, "%s: %d overrides written in %d call(s)\n", name, len(lines), len(batches))
	return nil
}

// partialNote says which lines a failed import wrote: the first done, in
// calls before call i of n.
func partialNote(name string, lines []importLine, done, i, n int) string {
	failed := fmt.Sprintf("call %d of %d failed: on bbolt it wrote nothing; on Redis (scripts of 1,000) its lines %d to %d may be part written", i+1, n, lines[done].line, lines[min(done+service.MaxBulkOverrides, len(lines))-1].line)
	if done == 0 {
		return "\n  " + failed + "; nothing else was written; the import is idempotent: run it again"
	}
	return fmt.Sprintf("\n  written: %s lines %d to %d (%d overrides, calls 1 to %d); %s; after: not written; the import is idempotent: run it again",
		name, lines[0].line, lines[done-1].line, done, i, failed)
}

// chunk cuts lines into batches of at most n.
func chunk(lines []importLine, n int) [][]importLine {
	var out [][]importLine
	for len(lines) > n {
		out = append(out, lines[:n])
		lines = lines[n:]
	}
	if len(lines) > 0 {
		out = append(out, lines)
	}
	return out
}

// bulk sends one batch to PUT /v1/overrides (a dry run when dry); a bad
// override the server names is reported as its file's line.
func (o *overridesCmd) bulk(name string, batch []importLine, dry bool) error {
	body := struct {
		Overrides []overrides.Override `json:"overrides"`
	}{make([]overrides.Override, len(batch))}
	for i, l := range batch {
		body.Overrides[i] = l.o
	}
	q := map[string][]string{}
	if dry {
		q["dry_run"] = []string{"true"}
	}
	err := o.c.call(context.Background(), "PUT", "/v1/overrides", q, body, nil)
	ae, ok := errors.AsType[*adminError](err)
	if !ok || ae.code != exitRejected {
		return err
	}
	if i, field, ok := ae.bulkIndex(); ok && i < len(batch) {
		ae.msg = fmt.Sprintf("%s:%d: %s: the server refused it: %s\n  nothing was written", name, batch[i].line, field, ae.detail)
	}
	return ae
}

// readImport reads and checks an import file: every line a valid override
// (domain filled from domain when the line names none, and required to be
// it otherwise), no domain and key twice. All bad lines are reported (up
// to 20), each as NAME:LINE: field: what is wrong.
func readImport(name string, r io.Reader, domain string) ([]importLine, error) {
	var out []importLine
	var bad []string
	seen := map[[2]string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		ov, err := importOne(text, domain)
		if err == nil {
			k := [2]string{ov.Domain, decide.BoundKey(ov.Key)}
			if first, dup := seen[k]; dup {
				err = fmt.Errorf("key: %q of domain %q is on line %d too; one override a key", ov.Key, ov.Domain, first)
			} else {
				seen[k] = n
			}
		}
		if err != nil {
			if len(bad) < 20 {
				bad = append(bad, fmt.Sprintf("%s:%d: %v", name, n, err))
			}
			continue
		}
		out = append(out, importLine{line: n, o: ov})
	}
	if err := sc.Err(); err != nil {
		return nil, usageError(fmt.Errorf("%s:%d: %v", name, n+1, err))
	}
	if len(bad) > 0 {
		return nil, usageError(fmt.Errorf("%s: nothing written, the file has errors:\n  %s", name, strings.Join(bad, "\n  ")))
	}
	if len(out) == 0 {
		return nil, usageError(fmt.Errorf("%s: no overrides in it", name))
	}
	return out, nil
}

// importOne reads one line: an error names the field ("field: what").
func importOne(text []byte, domain string) (overrides.Override, error) {
	ov, err := overrides.DecodeJSON(bytes.NewReader(text))
	if err != nil {
		if fe, ok := errors.AsType[*overrides.FieldError](err); ok {
			return ov, fmt.Errorf("%s: %s", fe.Field, fe.Msg)
		}
		if _, ok := errors.AsType[*json.SyntaxError](err); ok || strings.Contains(err.Error(), "unknown field") || strings.Contains(err.Error(), "more after") {
			return ov, fmt.Errorf("not an override object: %v", err)
		}
		return ov, err
	}
	switch {
	case ov.Domain == "" && domain != "":
		ov.Domain = domain
	case domain != "" && ov.Domain != domain:
		return ov, fmt.Errorf("domain: %q, but --domain is %q", ov.Domain, domain)
	}
	check := ov
	check.Key = decide.BoundKey(ov.Key) // a long key is stored bounded, as the server does
	if err := check.Validate(); err != nil {
		if fe, ok := errors.AsType[*overrides.FieldError](err); ok {
			return ov, fmt.Errorf("%s: %s", fe.Field, fe.Msg)
		}
		return ov, err
	}
	return ov, nil
}

// export is `overrides export`: every override of the domains named (of
// every live domain by default) as JSON lines.
func (o *overridesCmd) export() error {
	domains := []string(o.domains)
	if len(domains) == 0 {
		var err error
		if domains, err = o.liveDomains(); err != nil {
			return err
		}
	}
	w := o.stdout
	var f *os.File
	if o.out != "-" {
		var err error
		if f, err = os.Create(o.out); err != nil {
			return usageError(err)
		}
		defer f.Close()
		w = f
	}
	bw := bufio.NewWriter(w)
	total := 0
	for _, d := range domains {
		err := o.pages(d, "", 0, func(page []overrides.Override) error {
			for _, ov := range page {
				if err := writeJSONLine(bw, ov); err != nil {
					return err
				}
			}
			total += len(page)
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(o.stderr, "exported %d overrides of %d domain(s) to %s\n", total, len(domains), o.out)
	}
	return nil
}
