package main

import (
	"fmt"
	"math"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A group is one rules directory, both services started on it, and the
// scenarios sent to them.
type group struct {
	name  string
	files []string          // envoyproxy/ratelimit's files, relative to its module source
	own   map[string]string // files of this tool's, by name
	// floodgateFlags are added to `floodgate serve`.
	floodgateFlags []string
	scenarios      []scenario
}

type scenario struct {
	name  string
	steps []step
}

// A step is one request, sent repeat times (at least once) to both.
type step struct {
	req    *rlsv3.RateLimitRequest
	repeat int
	// known, when set, says why the answers differ by design, citing the
	// documentation: a difference there is counted as documented.
	known string
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	if len(kv)%2 != 0 {
		panic("desc: odd key, value list")
	}
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets a descriptor's own hits_addend.
func hits(n uint64, d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// negative marks a descriptor's hits as given back.
func negative(d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	d.IsNegativeHits = true
	return d
}

// ownLimit gives a descriptor its own limit (Envoy's limit override).
func ownLimit(rpu uint32, unit typev3.RateLimitUnit, d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

func rq(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// withHits sets a request's hits_addend.
func withHits(n uint32, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitRequest {
	r.HitsAddend = n
	return r
}

func once(r *rlsv3.RateLimitRequest) step         { return step{req: r} }
func times(n int, r *rlsv3.RateLimitRequest) step { return step{req: r, repeat: n} }
func known(why string, s step) step               { s.known = why; return s }
func sc(name string, steps ...step) scenario      { return scenario{name: name, steps: steps} }
func descString(d *rlcommon.RateLimitDescriptor) string {
	if d == nil {
		return "nil"
	}
	parts := make([]string, 0, len(d.Entries)+3)
	for _, e := range d.Entries {
		k, v := e.Key, e.Value
		if len(k) > 20 {
			k = fmt.Sprintf("%s…(%d bytes)", k[:8], len(k))
		}
		if len(v) > 20 {
			v = fmt.Sprintf("%s…(%d bytes)", v[:8], len(v))
		}
		parts = append(parts, k+"="+v)
	}
	if d.HitsAddend != nil {
		parts = append(parts, fmt.Sprintf("hits_addend=%d", d.HitsAddend.Value))
	}
	if d.IsNegativeHits {
		parts = append(parts, "is_negative_hits")
	}
	if d.Limit != nil {
		parts = append(parts, fmt.Sprintf("limit=%d/%s", d.Limit.RequestsPerUnit, d.Limit.Unit))
	}
	return strings.Join(parts, ",")
}

// many is n descriptors key=prefix<i>.
func many(n int, key, prefix string) []*rlcommon.RateLimitDescriptor {
	ds := make([]*rlcommon.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = desc(key, fmt.Sprintf("%s%d", prefix, i))
	}
	return ds
}

// Why answers differ by design, as the documentation says.
const (
	whyConsume  = "a request over a limit consumes nothing here; there its hits are counted (docs/SERVICE.md, Differences)"
	whyBounds   = "bounds on a request: InvalidArgument here, answered there (docs/SERVICE.md, Differences)"
	whyNegative = "is_negative_hits gives hits back here; the pinned peer ignores it (docs/SERVICE.md, Differences)"
	whyOwnLimit = "a descriptor's own limit needs --allow-request-limits here (docs/SERVICE.md, Differences)"
	whyQuota    = "quota_mode keeps duration_until_reset on a descriptor admitted over its quota; the peer drops it (docs/SERVICE.md, Differences)"
	whyMidStar  = "a * inside a value is a wildcard here, only a trailing * there (docs/RULES.md, Differences)"
	whyHugeHits = "a descriptor hits_addend beyond Redis's integers fails the call there; here it is over the limit (docs/SERVICE.md, Differences)"
)

const (
	testConfig  = "test/config/"
	integration = "test/integration/runtime/current/ratelimit/"
	examples    = "examples/ratelimit/config/"
)

// groups are the comparisons, in order. Keys that count are distinct per
// scenario (their values name it) unless a scenario means to share them.
func groups() []group {
	const td = "test-domain"
	return []group{
		{
			name:  "basic_config",
			files: []string{testConfig + "basic_config.yaml"},
			scenarios: []scenario{
				sc("first level without a limit (key1=value1)", times(2, rq(td, desc("key1", "value1")))),
				sc("nested, key-only second level (5/s)", times(7, rq(td, desc("key1", "value1", "subkey1", "nested-a")))),
				sc("nested, exact second level (10/s)", times(11, rq(td, desc("key1", "value1", "subkey1", "subvalue1")))),
				sc("nested under a value that does not match", once(rq(td, desc("key1", "other", "subkey1", "subvalue1")))),
				sc("key-only first level (20/min)", times(3, rq(td, desc("key2", "kv-a")))),
				sc("exact value overrides key-only (30/min)", times(2, rq(td, desc("key2", "value2")))),
				sc("exact value without a limit (whitelist)", times(2, rq(td, desc("key2", "value3")))),
				sc("1 per hour", times(3, rq(td, desc("key3", "h-a")))),
				sc("named limit, 1 per day", times(2, rq(td, desc("key4", "d-a")))),
				sc("limit at a level with children",
					times(2, rq(td, desc("key5", "value5"))),
					times(2, rq(td, desc("key5", "value5", "subkey5", "subvalue5"))),
					once(rq(td, desc("key5", "value5", "subkey5", "other")))),
				sc("unlimited", times(2, rq(td, desc("key6", "u-a")))),
				sc("detailed_metric (70/min)", times(2, rq(td, desc("key7", "dm-a")))),
				sc("depth mismatch: more entries than the path",
					once(rq(td, desc("key2", "dm-b", "extra", "x"))),
					once(rq(td, desc("key1", "value1", "subkey1", "subvalue1", "deeper", "x"))),
					once(rq(td, desc("key6", "u-b", "extra", "x")))),
				sc("depth mismatch: fewer entries than the path", once(rq(td, desc("key1", "value1")))),
				sc("unknown key", once(rq(td, desc("nope", "x")))),
				sc("unknown domain", once(rq("no-such-domain", desc("key2", "x")))),
				sc("entry order matters", once(rq(td, desc("subkey1", "subvalue1", "key1", "value1")))),
				sc("several descriptors in one request",
					times(3, rq(td, desc("key2", "multi-a"), desc("key3", "multi-a"), desc("key6", "x"), desc("nope", "x"), desc("key1", "value1", "subkey1", "multi-a")))),
				sc("request hits_addend",
					once(withHits(15, rq(td, desc("key2", "hits-a")))),
					once(withHits(5, rq(td, desc("key2", "hits-a")))),
					once(withHits(1, rq(td, desc("key2", "hits-a"))))),
				sc("request hits_addend beyond the limit, then one",
					known(whyConsume, once(withHits(25, rq(td, desc("key2", "hits-b"))))),
					known(whyConsume, once(rq(td, desc("key2", "hits-b"))))),
				sc("descriptor hits_addend (0 checks, it wins over the request's)",
					once(rq(td, hits(0, desc("key2", "hits-c")))),
					once(rq(td, hits(7, desc("key2", "hits-c")))),
					once(withHits(3, rq(td, hits(0, desc("key2", "hits-c"))))),
					once(withHits(3, rq(td, hits(2, desc("key2", "hits-c")), desc("key2", "hits-d")))),
					once(rq(td, hits(11, desc("key2", "hits-c"))))),
				sc("hits_addend 0 on a fresh key, and on a key over its limit",
					once(rq(td, hits(0, desc("key3", "hits-e")))),
					times(2, rq(td, desc("key3", "hits-e"))),
					known(whyConsume, once(rq(td, hits(0, desc("key3", "hits-e")))))),
				sc("empty value", times(2, rq(td, desc("key2", "")))),
			},
		},
		{
			name:  "shadowmode_config",
			files: []string{testConfig + "shadowmode_config.yaml"},
			scenarios: []scenario{
				sc("shadow_mode at the second level (10/s)", times(12, rq(td, desc("key1", "value1", "subkey1", "subvalue1")))),
				sc("not in shadow mode at the second level (5/s)", times(6, rq(td, desc("key1", "value1", "subkey1", "sh-a")))),
				sc("shadow_mode at the first level, with hits", once(withHits(20, rq(td, desc("key2", "sh-b")))), times(2, rq(td, desc("key2", "sh-b")))),
				sc("its exact value is not in shadow mode", once(withHits(30, rq(td, desc("key2", "value2")))), once(rq(td, desc("key2", "value2")))),
				sc("shadow and not together", known(whyConsume, once(withHits(30, rq(td, desc("key2", "sh-c"), desc("key2", "sh-d")))))),
			},
		},
		{
			name:  "wildcard",
			files: []string{testConfig + "wildcard.yaml"},
			scenarios: []scenario{
				sc("trailing wildcard foo* (20/min, each value its own)",
					once(withHits(20, rq(td, desc("wild", "foo1")))),
					once(rq(td, desc("wild", "foo1"))),
					once(rq(td, desc("wild", "foo2"))),
					once(rq(td, desc("wild", "foo"))),
					once(rq(td, desc("wild", "fo"))),
					once(rq(td, desc("wild", "bar")))),
				sc("no wildcard", once(rq(td, desc("noWild", "foo"))), once(rq(td, desc("noWild", "foo1")))),
				sc("key only", once(rq(td, desc("noVal", "anything")))),
				sc("star in the middle: bar*b", known(whyMidStar, once(rq(td, desc("midWild", "barab")))), once(rq(td, desc("midWild", "bar*b"))), once(rq(td, desc("midWild", "bar")))),
				sc("nested wildcard", once(rq(td, desc("nestedWild", "val1", "wild", "goo1"))), once(rq(td, desc("nestedWild", "val1", "wild", "go"))), once(rq(td, desc("nestedWild", "val2", "wild", "goo1")))),
			},
		},
		{
			name:  "share_threshold",
			files: []string{testConfig + "share_threshold.yaml"},
			scenarios: []scenario{
				sc("files/* share 100/min",
					once(withHits(99, rq(td, desc("files", "files/a")))),
					once(rq(td, desc("files", "files/b"))),
					once(rq(td, desc("files", "files/c")))),
				sc("nested under parent (200/min shared)",
					once(withHits(150, rq(td, desc("nested", "parent", "files", "nested/a")))),
					once(withHits(50, rq(td, desc("nested", "parent", "files", "nested/b")))),
					once(rq(td, desc("nested", "parent", "files", "nested/c")))),
				sc("same key at two levels (300/min)",
					once(withHits(300, rq(td, desc("files", "top/a", "files", "nested/a")))),
					once(rq(td, desc("files", "top/b", "files", "nested/b")))),
				sc("value_to_metric with share_threshold (60/min per method)",
					once(withHits(60, rq(td, desc("route", "api/v1", "method", "GET")))),
					once(rq(td, desc("route", "api/v2", "method", "GET"))),
					once(rq(td, desc("route", "api/v2", "method", "POST")))),
				sc("detailed_metric below a shared wildcard (80/min per endpoint)",
					once(withHits(80, rq(td, desc("service", "svc/a", "endpoint", "e1")))),
					once(rq(td, desc("service", "svc/b", "endpoint", "e1"))),
					once(rq(td, desc("service", "svc/b", "endpoint", "e2")))),
				sc("mixed: shared path/*, unshared file/* (120/min)",
					once(withHits(120, rq(td, desc("path", "path/a", "file", "file/x", "type", "t")))),
					once(rq(td, desc("path", "path/b", "file", "file/x", "type", "t"))),
					once(rq(td, desc("path", "path/b", "file", "file/y", "type", "t")))),
				sc("both shared (150/min)",
					once(withHits(150, rq(td, desc("user", "user/1", "resource", "res/1", "action", "read")))),
					once(rq(td, desc("user", "user/2", "resource", "res/2", "action", "read"))),
					once(rq(td, desc("user", "user/2", "resource", "res/2", "action", "write")))),
				sc("an exact value before a shared wildcard",
					times(2, rq(td, desc("file", "test1"))),
					once(withHits(99, rq(td, desc("file", "test2")))),
					once(rq(td, desc("file", "test3"))),
					once(rq(td, desc("file", "test4")))),
			},
		},
		{
			name: "integration",
			files: []string{integration + "config/basic.yaml", integration + "config/another.yaml",
				integration + "config/share_threshold.yaml", integration + "reload.yaml"},
			scenarios: []scenario{
				sc("basic key1 50/s", once(withHits(49, rq("basic", desc("key1", "i-a")))), times(2, rq("basic", desc("key1", "i-a")))),
				sc("one_per_minute", times(2, rq("basic", desc("one_per_minute", "i-a")))),
				sc("another domain, several descriptors",
					times(2, withHits(10, rq("another", desc("key2", "i-a"), desc("key3", "i-a"), desc("key4", "i-a"))))),
				sc("share-threshold-test: shared",
					once(withHits(9, rq("share-threshold-test", desc("files", "files/a")))),
					once(rq("share-threshold-test", desc("files", "files/b"))),
					once(rq("share-threshold-test", desc("files", "files/c")))),
				sc("share-threshold-test: not shared",
					once(withHits(10, rq("share-threshold-test", desc("files_no_share", "files_no_share/a")))),
					once(rq("share-threshold-test", desc("files_no_share", "files_no_share/b"))),
					once(rq("share-threshold-test", desc("files_no_share", "files_no_share/a")))),
				sc("requests_per_unit 0 blocks", times(2, rq("reload", desc("block", "i-a"))), once(rq("reload", hits(0, desc("block", "i-b"))))),
				sc("a blocked and an open descriptor", once(rq("reload", desc("block", "i-c"), desc("key1", "i-c")))),
			},
		},
		{
			name:  "examples",
			files: []string{examples + "config.yaml", examples + "example.yaml"},
			scenarios: []scenario{
				sc("mongo_cps", times(2, withHits(250, rq("mongo_cps", desc("database", "users")))), once(rq("mongo_cps", desc("database", "other")))),
				sc("limit on a parent and its children",
					times(3, rq("rl", desc("foo", "e-a"))),
					times(4, rq("rl", desc("foo", "e-b", "bar", "e-b"))),
					times(2, rq("rl", desc("foo", "e-c", "baz", "e-c")))),
				sc("shadow_mode on a value", times(4, rq("rl", desc("foo", "e-d", "baz", "shady")))),
				sc("not shadowed", times(4, rq("rl", desc("foo", "e-e", "baz", "not-so-shady")))),
				sc("unlimited child and top", once(rq("rl", desc("foo", "e-f", "bay", "x"))), once(rq("rl", desc("qux", "x")))),
				sc("replaces: category=account replaces bkthomps",
					times(2, rq("rl", desc("foo", "e-g", "bar", "bkthomps"))),
					times(3, rq("rl", desc("category", "account"), desc("foo", "e-h", "bar", "bkthomps")))),
				sc("replaces: a limit named in two requests",
					times(3, rq("rl", desc("source_cluster", "proxy", "destination_cluster", "bkthomps"), desc("foo", "e-i", "bar", "bkthomps")))),
				sc("replaces: a blocked limit replaced",
					once(rq("rl", desc("foo", "e-j", "bar", "banned"))),
					times(3, rq("rl", desc("source_cluster", "proxy", "destination_cluster", "override"), desc("foo", "e-j", "bar", "banned")))),
				sc("replaces: names that no limit has, and a named limit alone",
					times(3, rq("rl", desc("source_cluster", "proxy", "destination_cluster", "fake"))),
					once(rq("rl", desc("source_cluster", "proxy", "destination_cluster", "mock")))),
				sc("detailed_metric", times(3, rq("rl", desc("unspec", "e-k")))),
			},
		},
		{
			name:  "edge",
			files: []string{testConfig + "basic_config.yaml"},
			scenarios: []scenario{
				sc("empty domain", once(rq("", desc("key2", "x")))),
				sc("no descriptors", once(rq(td))),
				sc("a descriptor without entries", once(rq(td, &rlcommon.RateLimitDescriptor{}))),
				sc("a descriptor without entries beside a limited one", once(rq(td, desc("key2", "edge-a"), &rlcommon.RateLimitDescriptor{}))),
				sc("an entry with an empty key", known(whyBounds, once(rq(td, desc("", "x"))))),
				sc("an entry with an empty key and value", known(whyBounds, once(rq(td, desc("", ""))))),
				sc("an empty key after a matched one", known(whyBounds, once(rq(td, desc("key1", "value1", "", "x"))))),
				sc("64 descriptors", once(rq(td, many(64, "key2", "edge-b-")...))),
				sc("65 descriptors", known(whyBounds, once(rq(td, many(65, "key2", "edge-c-")...)))),
				sc("1000 descriptors", known(whyBounds, once(rq(td, many(1000, "key2", "edge-d-")...)))),
				sc("1000 descriptors matching nothing", known(whyBounds, once(rq(td, many(1000, "nope", "edge-e-")...)))),
				sc("33 entries", known(whyBounds, once(rq(td, desc(strings.Split(strings.Repeat("k,v,", 33), ",")[:66]...))))),
				sc("a 2 KiB value", once(rq(td, desc("key2", strings.Repeat("v", 2048))))),
				sc("a 2 KiB key", known(whyBounds, once(rq(td, desc(strings.Repeat("k", 2048), "v"))))),
				sc("request hits_addend 1,000,001", known(whyConsume, once(withHits(1_000_001, rq(td, desc("key2", "edge-f")))))),
				sc("request hits_addend max uint32", known(whyConsume, once(withHits(math.MaxUint32, rq(td, desc("key2", "edge-g")))))),
				sc("request hits_addend max uint32 on no limit", once(withHits(math.MaxUint32, rq(td, desc("nope", "x"))))),
				sc("descriptor hits_addend max int64", known(whyConsume, once(rq(td, hits(math.MaxInt64, desc("key2", "edge-h")))))),
				sc("descriptor hits_addend max uint64", known(whyHugeHits, once(rq(td, hits(math.MaxUint64, desc("key2", "edge-i")))))),
				sc("descriptor hits_addend max uint64 on no limit", once(rq(td, hits(math.MaxUint64, desc("nope", "x"))))),
				sc("is_negative_hits",
					once(withHits(10, rq(td, desc("key2", "edge-j")))),
					known(whyNegative, once(withHits(4, rq(td, negative(desc("key2", "edge-j")))))),
					known(whyNegative, once(rq(td, desc("key2", "edge-j"))))),
				sc("is_negative_hits on a fresh key", known(whyNegative, once(rq(td, negative(desc("key2", "edge-k")))))),
				sc("a descriptor's own limit, without --allow-request-limits", known(whyOwnLimit, times(3, rq(td, ownLimit(2, typev3.RateLimitUnit_MINUTE, desc("key2", "edge-l")))))),
			},
		},
		{
			name:           "request_limits",
			files:          []string{testConfig + "basic_config.yaml"},
			floodgateFlags: []string{"--allow-request-limits"},
			scenarios: []scenario{
				sc("a descriptor's own limit on a limited key", times(3, rq(td, ownLimit(2, typev3.RateLimitUnit_MINUTE, desc("key2", "rl-a"))))),
				sc("a descriptor's own limit on a key with no limit", times(3, rq(td, ownLimit(2, typev3.RateLimitUnit_HOUR, desc("nope", "rl-b"))))),
				sc("a descriptor's own limit on an unlimited key", times(2, rq(td, ownLimit(1, typev3.RateLimitUnit_SECOND, desc("key6", "rl-c"))))),
				sc("a descriptor's own limit on a whitelisted value", times(2, rq(td, ownLimit(1, typev3.RateLimitUnit_DAY, desc("key2", "value3"))))),
				sc("a descriptor's own limit in an unknown domain", times(2, rq("no-such-domain", ownLimit(1, typev3.RateLimitUnit_DAY, desc("key2", "rl-d"))))),
				sc("a descriptor's own limit of 0", times(2, rq(td, ownLimit(0, typev3.RateLimitUnit_MINUTE, desc("key2", "rl-e"))))),
				sc("a descriptor's own limit per month and per year",
					times(2, rq(td, ownLimit(1, typev3.RateLimitUnit_MONTH, desc("key2", "rl-g")))),
					times(2, rq(td, ownLimit(1, typev3.RateLimitUnit_YEAR, desc("key2", "rl-h"))))),
				sc("a descriptor's own limit beside a replacing one", times(2, rq(td, ownLimit(1, typev3.RateLimitUnit_MINUTE, desc("key4", "rl-i"))))),
				sc("a descriptor's own limit with an unknown unit", once(rq(td, ownLimit(5, typev3.RateLimitUnit_UNKNOWN, desc("key2", "rl-f"))))),
			},
		},
		{
			name: "own_rules",
			own:  map[string]string{"envoydiff.yaml": ownRules},
			scenarios: []scenario{
				sc("quota_mode", times(2, rq("envoydiff", desc("quota", "o-a"))), known(whyQuota, once(rq("envoydiff", desc("quota", "o-a"))))),
				sc("quota_mode beside a limit", times(2, rq("envoydiff", desc("quota", "o-b"), desc("day", "o-b"))), known(whyQuota, once(rq("envoydiff", desc("quota", "o-b"), desc("day", "o-b"))))),
				sc("requests_per_unit 0 in shadow mode", times(2, rq("envoydiff", desc("blocked_shadow", "o-c")))),
				sc("week, month and year windows", times(4, rq("envoydiff", desc("weekly", "o-d"), desc("monthly", "o-d"), desc("yearly", "o-d")))),
				sc("unit in capitals", times(2, rq("envoydiff", desc("caps", "o-e")))),
				sc("a named unlimited limit replaced", once(rq("envoydiff", desc("free", "o-f"), desc("replacer", "o-f")))),
				sc("replaces across descriptors, both ways", times(2, rq("envoydiff", desc("replacer", "o-g"), desc("named", "o-g")))),
				sc("a limit replacing itself by name in another descriptor", times(2, rq("envoydiff", desc("named", "o-h"), desc("named", "o-i")))),
			},
		},
	}
}

// ownRules is this tool's rules file, for what envoyproxy/ratelimit's test
// files leave out.
const ownRules = `domain: envoydiff
descriptors:
  - key: quota
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: day
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: blocked_shadow
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 0
  - key: weekly
    rate_limit:
      unit: week
      requests_per_unit: 3
  - key: monthly
    rate_limit:
      unit: month
      requests_per_unit: 3
  - key: yearly
    rate_limit:
      unit: year
      requests_per_unit: 3
  - key: caps
    rate_limit:
      unit: HOUR
      requests_per_unit: 1
  - key: free
    rate_limit:
      name: free
      unlimited: true
  - key: named
    rate_limit:
      name: named
      unit: minute
      requests_per_unit: 1
  - key: replacer
    rate_limit:
      unit: minute
      requests_per_unit: 1
      replaces:
        - name: free
        - name: named
`
