package refmodel

import "time"

// calendar finds calendar windows in a time zone by definition: a local day
// begins at the first instant whose local date is that day (or later, when a
// zone skips a whole date), found by bisecting the time line, not by
// time.Date.
type calendar struct {
	unit  Calendar
	loc   *time.Location
	wd0   time.Weekday
	cache map[civil]int64
}

type civil struct {
	y    int
	m    time.Month
	d    int
	zone *time.Location
}

func newCalendar(u Calendar, loc *time.Location, wd0 time.Weekday) *calendar {
	if loc == nil {
		loc = time.UTC
	}
	return &calendar{unit: u, loc: loc, wd0: wd0, cache: map[civil]int64{}}
}

// norm normalises a civil date (day 0 is the last of the month before, ...).
func norm(y int, m time.Month, d int) (int, time.Month, int) {
	return time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Date()
}

func before(y1 int, m1 time.Month, d1 int, y2 int, m2 time.Month, d2 int) bool {
	if y1 != y2 {
		return y1 < y2
	}
	if m1 != m2 {
		return m1 < m2
	}
	return d1 < d2
}

// dayStart returns the first instant (µs) whose local date is y-m-d or later.
func (c *calendar) dayStart(y int, m time.Month, d int) int64 {
	y, m, d = norm(y, m, d)
	k := civil{y, m, d, c.loc}
	if t, ok := c.cache[k]; ok {
		return t
	}
	// Local time is UTC plus at most ±14 hours, and zones that skip a date
	// skip one: the instant lies within 40 hours of the civil midnight read
	// as UTC.
	mid := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).UnixMicro()
	const h40 = 40 * 3600 * 1_000_000
	on := func(u int64) bool {
		ly, lm, ld := time.UnixMicro(u).In(c.loc).Date()
		return !before(ly, lm, ld, y, m, d)
	}
	t := first(mid-h40, on)
	if t >= mid+h40 {
		panic("refmodel: calendar search out of range")
	}
	c.cache[k] = t
	return t
}

// window returns the calendar window [start, end) holding t.
func (c *calendar) window(t int64) (int64, int64) {
	y, m, d := time.UnixMicro(t).In(c.loc).Date()
	switch c.unit {
	case CalDay:
		return c.dayStart(y, m, d), c.dayStart(y, m, d+1)
	case CalWeek:
		wd := time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Weekday()
		back := (int(wd) - int(c.wd0) + 7) % 7
		return c.dayStart(y, m, d-back), c.dayStart(y, m, d-back+7)
	default:
		return c.dayStart(y, m, 1), c.dayStart(y, m+1, 1)
	}
}
