package rules

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
)

// An Error is one problem in a rules file: where it is and which field.
// Its text is "file:line: field: message", e.g.
//
//	rules/api.yaml:12: descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
//
// Parse returns every Error it finds, joined with errors.Join; use
// errors.As on the joined error's Unwrap() []error to reach each one.
type Error struct {
	File  string // the file, as given to Parse or found by LoadDir
	Line  int    // 1-based; 0 when the problem has no line (a file too large, say)
	Field string // the field's path, e.g. "descriptors[0].rate_limit.unit"; "" for the file as a whole
	Msg   string // what is wrong
}

// Error returns "file:line: field: message", leaving out the line and
// the field when there are none.
func (e *Error) Error() string {
	s := e.File
	if e.Line > 0 {
		s += ":" + strconv.Itoa(e.Line)
	}
	if e.Field != "" {
		s += ": " + e.Field
	}
	return s + ": " + e.Msg
}

// maxErrors is the most errors one file reports; the rest are summarised.
const maxErrors = 50

// errList gathers a file's errors.
type errList struct {
	file  string
	errs  []error
	extra int
}

func (l *errList) add(line int, field, format string, args ...any) {
	if len(l.errs) >= maxErrors {
		l.extra++
		return
	}
	l.errs = append(l.errs, &Error{File: l.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (l *errList) err() error {
	if len(l.errs) == 0 {
		return nil
	}
	errs := l.errs
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].(*Error).Line < errs[j].(*Error).Line })
	if l.extra > 0 {
		errs = append(errs[:len(errs):len(errs)], &Error{File: l.file, Msg: fmt.Sprintf("%d more errors not shown", l.extra)})
	}
	return errors.Join(errs...)
}
