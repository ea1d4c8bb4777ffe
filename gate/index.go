package gate

import (
	"bytes"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// indexMin is the number of limits from which a gate looks a request's
// candidates up in its routeIndex rather than trying every limit. Below
// it, trying them all is as fast (BenchmarkCheckRoutes).
const indexMin = 8

// A routeIndex narrows a request to the limits that can match it, by host
// and leading path segments, so that a gate of thousands of limits (one
// per API endpoint, per tenant host) tries a few per request. It only
// narrows: every candidate is still decided by limit.match, and every limit
// that matches is a candidate. Candidates come in configuration order.
//
// A limit is filed under each of its hosts (none: anyHost), and under each
// host by the literal segments its path condition starts with: Path
// "/api/users/*" and PathPrefix "/api/users/" under api → users, PathPrefix
// "/api/us" under api, Path "/*/x" and no path condition at the root.
type routeIndex struct {
	exact    map[string]*segTrie // by the host folded (foldHost)
	wild     map[string]*segTrie // "*.example.com" by ".example.com" folded
	wildDots []int               // the dot counts of wild's keys, ascending
	anyHost  segTrie             // limits without a host condition
}

// A segTrie holds limits by the literal path segments they require.
type segTrie struct {
	here []int               // limits whose segments end here, ascending
	next map[string]*segTrie // by the next segment
}

// newRouteIndex indexes ls, whose positions are the candidates' numbers.
func newRouteIndex(ls []*limit) *routeIndex {
	x := &routeIndex{exact: map[string]*segTrie{}, wild: map[string]*segTrie{}}
	for i, l := range ls {
		chain := pathChain(l)
		if len(l.hosts) == 0 {
			x.anyHost.add(chain, i)
			continue
		}
		for _, h := range l.hosts {
			m, key := x.exact, h
			if strings.HasPrefix(h, "*.") {
				m, key = x.wild, h[1:]
			}
			key = string(foldHost(nil, key))
			t := m[key]
			if t == nil {
				t = &segTrie{}
				m[key] = t
				if strings.HasPrefix(h, "*.") {
					x.addDots(strings.Count(key, "."))
				}
			}
			t.add(chain, i) // twice under one host ("a.com", "A.com") is once
		}
	}
	return x
}

// addDots notes that a wildcard's suffix has d dots.
func (x *routeIndex) addDots(d int) {
	if i, found := slices.BinarySearch(x.wildDots, d); !found {
		x.wildDots = slices.Insert(x.wildDots, i, d)
	}
}

// pathChain returns the literal segments every path a limit matches
// starts with: the longer of its Path pattern's segments before the first
// "*" and its PathPrefix's complete segments (those a '/' ends).
func pathChain(l *limit) []string {
	var chain []string
	if len(l.pathSegs) > 1 { // pathSegs[0] is the "" before the first '/'
		for _, s := range l.pathSegs[1:] {
			if s == "*" {
				break
			}
			chain = append(chain, s)
		}
	}
	if p := l.Match.PathPrefix; len(p) > 1 {
		segs := strings.Split(p[1:], "/")
		if segs = segs[:len(segs)-1]; len(segs) > len(chain) {
			chain = segs
		}
	}
	return chain
}

// add files limit i under chain.
func (t *segTrie) add(chain []string, i int) {
	for _, s := range chain {
		n := t.next[s]
		if n == nil {
			if t.next == nil {
				t.next = map[string]*segTrie{}
			}
			n = &segTrie{}
			t.next[s] = n
		}
		t = n
	}
	if k := len(t.here); k == 0 || t.here[k-1] != i {
		t.here = append(t.here, i)
	}
}

// walk appends the lists of limits that path's leading segments lead to.
// It follows the path only as deep as the trie goes, so a long path costs
// no more than a short one.
func (t *segTrie) walk(path string, lists [][]int) [][]int {
	if len(t.here) > 0 {
		lists = append(lists, t.here)
	}
	if t.next == nil || path == "" || path[0] != '/' {
		return lists
	}
	p := path[1:]
	for {
		seg, rest, more := strings.Cut(p, "/")
		if t = t.next[seg]; t == nil {
			return lists
		}
		if len(t.here) > 0 {
			lists = append(lists, t.here)
		}
		if !more || t.next == nil {
			return lists
		}
		p = rest
	}
}

// lookup appends the candidate lists of a request for host (its port and
// root dot removed: hostOnly) and path (as limit.match sees it).
func (x *routeIndex) lookup(host, path string, lists [][]int) [][]int {
	lists = x.anyHost.walk(path, lists)
	if len(x.exact) == 0 && len(x.wild) == 0 {
		return lists
	}
	var buf [128]byte
	h := foldHost(buf[:0], host)
	if t := x.exact[string(h)]; t != nil {
		lists = t.walk(path, lists)
	}
	// "*.example.com" matches the hosts whose suffix from their second
	// dot from the end is ".example.com", with something before it: for
	// each dot count of the wildcards, look that suffix up.
	i, dots := len(h), 0
	for _, d := range x.wildDots {
		for dots < d && i > 0 {
			i = bytes.LastIndexByte(h[:i], '.')
			dots++
		}
		if dots < d || i <= 0 {
			break
		}
		if t := x.wild[string(h[i:])]; t != nil {
			lists = t.walk(path, lists)
		}
	}
	return lists
}

// foldHost appends s case-folded, such that two strings are equal under
// strings.EqualFold (as limit.match compares hosts) exactly when their
// folds are equal: each rune becomes the least of its case-folding orbit
// ('a' and 'A' are 'A'; 'k', 'K' and the Kelvin sign are 'K'), a byte that
// is no UTF-8 U+FFFD, as EqualFold reads it.
func foldHost(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return foldUnicode(dst, s)
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

func foldUnicode(dst []byte, s string) []byte {
	for _, r := range s { // an invalid byte is utf8.RuneError
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		dst = utf8.AppendRune(dst, m)
	}
	return dst
}

// nextCandidate removes and returns the least number at the head of
// lists (each ascending), and that number's copies at the other heads; -1
// when they are empty.
func nextCandidate(lists [][]int) int {
	next := -1
	for _, l := range lists {
		if len(l) > 0 && (next < 0 || l[0] < next) {
			next = l[0]
		}
	}
	if next >= 0 {
		for k, l := range lists {
			if len(l) > 0 && l[0] == next {
				lists[k] = l[1:]
			}
		}
	}
	return next
}
