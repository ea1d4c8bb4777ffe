package service

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/floodgate/floodgate/overrides"
)

// overrideSearchScan bounds the overrides one filtered listing reads from
// the store: past it the page ends short, and its next key says where to
// go on.
const overrideSearchScan = 10_000

// overrideSearch is a filtered listing's answer: the page, and where the
// next starts ("" when the search reached the end of the domain's
// overrides, or of those with the prefix).
type overrideSearch struct {
	Overrides []overrides.Override `json:"overrides"`
	Next      string               `json:"next"`
	Scanned   int                  `json:"scanned"` // overrides read from the store for this page
}

// overrideFilter is a listing's filter: a key prefix (bytes, exact) and a
// substring of the key or note (case-insensitive).
type overrideFilter struct {
	prefix   string
	contains string // lower-cased
}

// readOverrideFilter reads ?prefix= and ?q=, each at most
// overrides.MaxKeyLen bytes of UTF-8 (else an error naming the
// parameter); ok false when neither is given.
func readOverrideFilter(r *http.Request) (f overrideFilter, ok bool, err error) {
	for _, p := range []struct {
		name string
		to   *string
	}{{"prefix", &f.prefix}, {"q", &f.contains}} {
		v := r.URL.Query().Get(p.name)
		switch {
		case len(v) > overrides.MaxKeyLen:
			return f, false, fmt.Errorf("%s: at most %d bytes, got %d", p.name, overrides.MaxKeyLen, len(v))
		case !utf8.ValidString(v):
			return f, false, fmt.Errorf("%s: must be UTF-8", p.name)
		}
		*p.to = v
	}
	f.contains = strings.ToLower(f.contains)
	return f, f.prefix != "" || f.contains != "", nil
}

// match reports whether o passes the filter.
func (f *overrideFilter) match(o *overrides.Override) bool {
	if !strings.HasPrefix(o.Key, f.prefix) {
		return false
	}
	return f.contains == "" || strings.Contains(strings.ToLower(o.Key), f.contains) || strings.Contains(strings.ToLower(o.Note), f.contains)
}

// search lists up to limit overrides of domain after after that pass f,
// reading at most overrideSearchScan of them: with a prefix from the
// prefix's first key to its last, else the whole domain.
func (f *overrideFilter) search(ctx context.Context, st overrides.Store, domain, after string, limit int) (overrideSearch, error) {
	out := overrideSearch{Overrides: []overrides.Override{}}
	cursor := after
	if f.prefix != "" && cursor < f.prefix {
		// every key with the prefix sorts after the prefix less its last
		// byte; the keys between are read and skipped
		cursor = f.prefix[:len(f.prefix)-1]
	}
	for {
		want := min(overrides.MaxListLimit, overrideSearchScan-out.Scanned)
		page, err := st.List(ctx, domain, cursor, want)
		if err != nil {
			return out, err
		}
		for i := range page {
			o := &page[i]
			out.Scanned++
			cursor = o.Key
			if f.prefix != "" && o.Key > f.prefix && !strings.HasPrefix(o.Key, f.prefix) {
				return out, nil // past the prefix's keys: the end
			}
			if f.match(o) {
				out.Overrides = append(out.Overrides, *o)
				if len(out.Overrides) == limit {
					out.Next = o.Key
					return out, nil
				}
			}
		}
		if len(page) < want {
			return out, nil // the last page
		}
		if out.Scanned >= overrideSearchScan {
			out.Next = cursor
			return out, nil
		}
	}
}
