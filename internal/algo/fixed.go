package algo

import "time"

// Fixed window (FixedWindow), as redisstore/lua/30_fixed.lua. State: s[0]
// the window's start, s[1] its count. Windows are aligned to the epoch,
// or follow the calendar in the rule's location.

func fixedAdvance(p *Params, s []int64, now int64) int64 {
	ws, _ := p.windowAt(s[0], now)
	switch {
	case ws > s[0]:
		s[0], s[1] = ws, 0
	case ws < s[0]:
		now = s[0]
	}
	return now
}

func fixedReset(p *Params, s []int64, now int64) int64 {
	if s[1] == 0 {
		return 0
	}
	_, end := p.windowAt(s[0], now)
	return end - now
}

func fixedRetry(p *Params, s []int64, now int64) int64 {
	_, end := p.windowAt(s[0], now)
	return end - now
}

// Window returns the fixed window [start, end) holding now.
func (p *Params) Window(now int64) (int64, int64) { return p.window(now) }

// windowAt returns the fixed window holding now, knowing that the state's
// window starts at s0: most requests fall in it, which saves a division.
func (p *Params) windowAt(s0, now int64) (int64, int64) {
	if p.Cal == CalNone && s0 <= now && now-s0 < p.Period {
		return s0, s0 + p.Period
	}
	return p.window(now)
}

// window returns the fixed window [start, end) holding now.
func (p *Params) window(now int64) (int64, int64) {
	if p.Cal == CalNone {
		ws := floorDiv(now, p.Period) * p.Period
		return ws, ws + p.Period
	}
	t := time.UnixMicro(now).In(p.Loc)
	y, m, d := t.Date()
	switch p.Cal {
	case CalDay:
		return dayStart(y, m, d, p.Loc), dayStart(y, m, d+1, p.Loc)
	case CalWeek:
		back := (int(t.Weekday()) - int(p.WeekDay0) + 7) % 7
		return dayStart(y, m, d-back, p.Loc), dayStart(y, m, d-back+7, p.Loc)
	}
	return dayStart(y, m, 1, p.Loc), dayStart(y, m+1, 1, p.Loc)
}

// dayStart returns the first instant of the local day y-m-d (normalised as
// time.Date does), or of the next one if the zone skipped that date.
// time.Date alone gets it wrong when a clock change skips midnight (it
// returns 23:00 of the day before, making the window end before it starts)
// or repeats it (it returns the second midnight).
func dayStart(y int, m time.Month, d int, loc *time.Location) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if localDay(t).Before(day) { // midnight skipped: the day begins at the change
		_, end := t.ZoneBounds()
		return end.UnixMicro()
	}
	if p := t.Add(-time.Microsecond); !localDay(p).Before(day) { // midnight repeated
		_, po := p.Zone()
		_, to := t.Zone()
		t = t.Add(time.Duration(to-po) * time.Second)
	}
	return t.UnixMicro()
}

// localDay returns t's local date as midnight UTC, for comparing dates.
func localDay(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}
