package main

import (
	"fmt"
	"strings"
)

// promqlNames returns the metric names a PromQL expression reads: the
// identifiers that are neither functions nor aggregations (an identifier
// followed by "("), keywords, label names (in {…} matchers and in
// by/without/on/ignoring/group_left/group_right lists), label values or
// other strings, durations ([5m], offset 1h) nor numbers. It errors on an
// unterminated string or unbalanced brackets. It is a tokenizer, not a
// parser: enough to name the metrics, not to prove the expression valid.
func promqlNames(expr string) ([]string, error) {
	l := &promqlLexer{s: expr}
	var names []string
	for l.i < len(l.s) {
		name, err := l.next()
		if err != nil {
			return nil, fmt.Errorf("%q at %d: %w", expr, l.i, err)
		}
		if name != "" {
			names = append(names, name)
		}
	}
	if l.depth != 0 {
		return nil, fmt.Errorf("%q: unbalanced parentheses", expr)
	}
	return names, nil
}

// promqlKeywords are identifiers that are never metric names when not
// followed by "(": binary operators, modifiers, and the aggregations
// (written "sum by (x) (…)", their name is followed by "by").
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "offset": true, "bool": true, "atan2": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// promqlLabelLists are the keywords followed by a parenthesized list of
// label names.
var promqlLabelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true}

type promqlLexer struct {
	s     string
	i     int
	depth int // open parentheses
}

// next reads one token and returns it if it is a metric name.
func (l *promqlLexer) next() (string, error) {
	c := l.s[l.i]
	switch {
	case strings.IndexByte("\"'`{}[]()", c) >= 0:
		return "", l.punct(c)
	case c == '#':
		for l.i < len(l.s) && l.s[l.i] != '\n' {
			l.i++
		}
		return "", nil
	case c == '$': // a dashboard variable
		l.i++
		l.ident()
		return "", nil
	case isDigit(c) || c == '.':
		for l.i < len(l.s) && (isIdentChar(l.s[l.i]) || l.s[l.i] == '.') {
			l.i++
		}
		return "", nil
	case isIdentStart(c):
		return l.identifier()
	}
	l.i++
	return "", nil
}

// punct reads a quote or a bracket and what it opens.
func (l *promqlLexer) punct(c byte) error {
	switch c {
	case '{':
		return l.skipUntil('}')
	case '[':
		return l.skipUntil(']')
	case '(':
		l.depth++
	case ')':
		if l.depth--; l.depth < 0 {
			return fmt.Errorf("unbalanced )")
		}
	case '}', ']':
		return fmt.Errorf("unbalanced %c", c)
	default:
		return l.skipString()
	}
	l.i++
	return nil
}

// identifier reads an identifier and classifies it.
func (l *promqlLexer) identifier() (string, error) {
	id := l.ident()
	rest := strings.TrimLeft(l.s[l.i:], " \t\r\n")
	switch {
	case promqlLabelLists[id] && strings.HasPrefix(rest, "("):
		l.i = len(l.s) - len(rest)
		return "", l.skipUntil(')')
	case promqlKeywords[id], strings.EqualFold(id, "inf"), strings.EqualFold(id, "nan"):
		return "", nil
	case strings.HasPrefix(rest, "("): // a function
		return "", nil
	}
	return id, nil
}

func (l *promqlLexer) ident() string {
	start := l.i
	for l.i < len(l.s) && isIdentChar(l.s[l.i]) {
		l.i++
	}
	return l.s[start:l.i]
}

// skipString skips a quoted string (with backslash escapes but in `raw`).
func (l *promqlLexer) skipString() error {
	q := l.s[l.i]
	for l.i++; l.i < len(l.s); l.i++ {
		switch {
		case l.s[l.i] == '\\' && q != '`':
			l.i++
		case l.s[l.i] == q:
			l.i++
			return nil
		}
	}
	return fmt.Errorf("unterminated string")
}

// skipUntil skips to past the closing byte, over strings in between.
func (l *promqlLexer) skipUntil(end byte) error {
	open := l.s[l.i]
	for l.i++; l.i < len(l.s); {
		switch c := l.s[l.i]; {
		case c == end:
			l.i++
			return nil
		case c == '"' || c == '\'' || c == '`':
			if err := l.skipString(); err != nil {
				return err
			}
		case c == '{' || c == '[' || c == '(' || c == '}' || c == ']' || c == ')':
			return fmt.Errorf("%c inside %c…%c", c, open, end)
		default:
			l.i++
		}
	}
	return fmt.Errorf("unclosed %c", open)
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20) >= 'a' && (c|0x20) <= 'z' }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }
