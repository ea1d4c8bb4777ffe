package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/service"
)

type overrideSearchJSON struct {
	Overrides []struct {
		Key  string `json:"key"`
		Note string `json:"note"`
	} `json:"overrides"`
	Next    string `json:"next"`
	Scanned int    `json:"scanned"`
}

// searchAll follows a filtered listing's pages (limit each) to the end and
// returns the keys found and the pages it took.
func searchAll(t *testing.T, base, domain, query string, limit int) (keys []string, pages int) {
	t.Helper()
	after := ""
	for {
		pages++
		code, body := adminCall(t, base, "GET", fmt.Sprintf("/v1/overrides/%s?limit=%d&%s&after=%s", domain, limit, query, url.QueryEscape(after)), "")
		if code != 200 {
			t.Fatalf("%s: %d %s", query, code, body)
		}
		var page overrideSearchJSON
		if err := json.Unmarshal([]byte(body), &page); err != nil {
			t.Fatalf("%s: %v: %s", query, err, body)
		}
		if len(page.Overrides) > limit {
			t.Fatalf("%s: %d overrides on a page of %d", query, len(page.Overrides), limit)
		}
		for _, o := range page.Overrides {
			keys = append(keys, o.Key)
		}
		if page.Next == "" {
			return keys, pages
		}
		if page.Next <= after {
			t.Fatalf("%s: next %q does not move past %q", query, page.Next, after)
		}
		after = page.Next
		if pages > 1000 {
			t.Fatalf("%s: no end", query)
		}
	}
}

// The overrides listing's server-side filter, on bbolt and on Redis: a key
// prefix and a case-insensitive substring of the key or note, each page at
// most limit long, followed page by page to exactly the matching keys (an
// expected set computed here from what was written), none missed, none
// twice, none of another domain; a search reads at most 10,000 overrides a
// call and then says where to go on; bad parameters are refused naming
// them; the unfiltered listing is as before (an array).
func TestOverrideListingFilters(t *testing.T) {
	stores := map[string]func(t *testing.T) overrides.Store{
		"bolt": func(t *testing.T) overrides.Store { return overrideCache(t) },
		"redis": func(t *testing.T) overrides.Store {
			rs := redistest.Standalone(t)
			st, err := redisstore.New("redis://"+rs.Addr, redisstore.Options{ClientTime: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			c := overrides.NewCache(overrides.NewRedis(st.Client(), "ovr"), 1024, 0)
			t.Cleanup(func() { c.Close() })
			return c
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			var all []overrides.Override
			for i := range 10_050 {
				o := overrides.Override{Domain: "t", Key: fmt.Sprintf("user=u%05d", i), Limit: 5, Period: time.Second}
				switch {
				case i%1000 == 7:
					o.Note = "VIP customer"
				case i >= 10_040:
					o.Key = fmt.Sprintf("zone=z%d", i) // after user= in byte order: the scan bound binds before them
				}
				all = append(all, o)
			}
			// another domain's override that every filter would match
			all = append(all, overrides.Override{Domain: "u", Key: "user=u00007", Limit: 1, Period: time.Second, Note: "vip"})
			if err := st.(overrides.BatchStore).PutMany(context.Background(), all); err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, service.Options{Overrides: st}, testRules)
			srv := httptest.NewServer(e.svc.AdminHandler(""))
			t.Cleanup(srv.Close)

			want := func(match func(o overrides.Override) bool) []string {
				var ks []string
				for _, o := range all {
					if o.Domain == "t" && match(o) {
						ks = append(ks, o.Key)
					}
				}
				slices.Sort(ks)
				return ks
			}
			for _, c := range []struct {
				query string
				limit int
				match func(o overrides.Override) bool
			}{
				{"prefix=user%3Du0001", 7, func(o overrides.Override) bool { return strings.HasPrefix(o.Key, "user=u0001") }},
				{"prefix=zone%3D", 3, func(o overrides.Override) bool { return strings.HasPrefix(o.Key, "zone=") }},
				{"prefix=user%3Du099", 1000, func(o overrides.Override) bool { return strings.HasPrefix(o.Key, "user=u099") }},
				{"prefix=nobody", 10, func(overrides.Override) bool { return false }},
				// the note, in any case
				{"q=vip", 2, func(o overrides.Override) bool { return o.Note != "" }},
				{"q=U0420", 5, func(o overrides.Override) bool { return strings.Contains(o.Key, "u0420") }},
				{"prefix=user%3D&q=customer", 100, func(o overrides.Override) bool { return o.Note != "" }},
				// beyond the scan bound: found on a later call
				{"q=zone%3Dz1004", 10, func(o overrides.Override) bool { return strings.HasPrefix(o.Key, "zone=z1004") }},
			} {
				got, pages := searchAll(t, srv.URL, "t", c.query, c.limit)
				if w := want(c.match); !slices.Equal(got, w) {
					t.Errorf("%s: %d keys %.200v, want %d %.200v", c.query, len(got), got, len(w), w)
				}
				t.Logf("%s: %d keys in %d pages", c.query, len(got), pages)
			}
			// a search that reads 10,000 overrides without finding a page
			// full ends its call there, saying where to go on
			code, body := adminCall(t, srv.URL, "GET", "/v1/overrides/t?q=zone", "")
			var page overrideSearchJSON
			if err := json.Unmarshal([]byte(body), &page); code != 200 || err != nil {
				t.Fatalf("bounded search: %d %s %v", code, body, err)
			}
			if page.Scanned != 10_000 || page.Next != "user=u09999" || len(page.Overrides) != 0 {
				t.Errorf("bounded search: scanned %d, next %q, %d found; want 10000, user=u09999, 0", page.Scanned, page.Next, len(page.Overrides))
			}
			for q, field := range map[string]string{
				"q=" + strings.Repeat("x", overrides.MaxKeyLen+1): "q:",
				"prefix=%ff":          "prefix:",
				"q=a&limit=0":         "limit:",
				"prefix=a&limit=1001": "limit:",
			} {
				if code, body := adminCall(t, srv.URL, "GET", "/v1/overrides/t?"+q, ""); code != 400 || !strings.Contains(body, field) {
					t.Errorf("%.40s: %d %s, want 400 naming %s", q, code, body, field)
				}
			}
			// unfiltered: an array, as before
			code, body = adminCall(t, srv.URL, "GET", "/v1/overrides/t?limit=2", "")
			var arr []overrides.Override
			if err := json.Unmarshal([]byte(body), &arr); code != 200 || err != nil || len(arr) != 2 || arr[0].Key != "user=u00000" {
				t.Errorf("unfiltered listing: %d %s", code, body)
			}
		})
	}
}
