package dashboard

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/service"
)

// TopKeys is how many keys of each rule a snapshot lists.
const TopKeys = 10

// Snapshot is one event of /dashboard/events.
type Snapshot struct {
	Server   string                       `json:"server"`
	Outcomes [recorder.NumOutcomes]string `json:"outcomes"` // the order of each series' counts
	Time     int64                        `json:"time"`     // the last second in Series (unix seconds)
	// Series are the seconds after the previous snapshot's Time (every
	// second kept, in a stream's first snapshot), per rule with decisions
	// in them.
	Series  []recorder.Series `json:"series"`
	Latency recorder.Latency  `json:"latency"`
	Top     []service.TopRule `json:"top"`
	Health  Health            `json:"health"`
	Rules   *Rules            `json:"rules"` // nil: the server has none to show
	// Tracks are server- and store-level series over the same seconds as
	// Series: "tiers" (decisions answered without a Redis call, and the
	// Redis calls) on a Redis store, "shed" (requests the proxy's
	// throttler shed, by criticality) on a proxy with a throttler; empty
	// when the server has none (the page shows no chart for those).
	Tracks []recorder.TrackSeries `json:"tracks"`
	Panels Panels                 `json:"panels"`
}

// TrackSource is a Source with server- or store-level series
// (recorder.Recorder.Track).
type TrackSource interface {
	// Tracks returns the series' seconds after since up to upto, the last
	// second Series returned.
	Tracks(since, upto int64) []recorder.TrackSeries
}

// Panels say which panels the server has data for.
type Panels struct {
	Admin   bool `json:"admin"` // key inspector, overrides editor (the admin API)
	Rules   bool `json:"rules"`
	Latency bool `json:"latency"` // the decision latency chart
}

// snapshot is the server's state, with the seconds after since.
func (d *Dashboard) snapshot(since int64) Snapshot {
	series, lat, last := d.src.Series(since)
	if series == nil {
		series = []recorder.Series{}
	}
	top := d.src.Top(TopKeys)
	if top == nil {
		top = []service.TopRule{}
	}
	rules := d.src.Rules()
	tracks := []recorder.TrackSeries{}
	if ts, ok := d.src.(TrackSource); ok && last != 0 {
		tracks = append(tracks, ts.Tracks(since, last)...)
	}
	return Snapshot{Tracks: tracks, Server: d.opts.Server, Outcomes: recorder.OutcomeNames, Time: last, Series: series, Latency: lat,
		Top: top, Health: d.src.Health(), Rules: rules, Panels: Panels{Admin: d.opts.Admin != nil, Rules: rules != nil, Latency: !d.opts.NoLatency}}
}

// events serves GET /dashboard/events: a snapshot at once, then one every
// Interval, until the client leaves, the session expires or is logged
// out (the page logs in again) or the dashboard closes. At most MaxStreams are open at once.
func (d *Dashboard) events(w http.ResponseWriter, r *http.Request, s session) {
	select {
	case d.streams <- struct{}{}:
		defer func() { <-d.streams }()
	default:
		http.Error(w, "too many dashboard streams open", http.StatusServiceUnavailable)
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	var expired <-chan time.Time
	if s.cookie {
		t := time.NewTimer(s.expires.Sub(d.opts.Now()))
		defer t.Stop()
		expired = t.C
	}
	tick := time.NewTicker(d.opts.Interval)
	defer tick.Stop()
	if _, err := w.Write([]byte("retry: 3000\n\n")); err != nil {
		return
	}
	var since int64
	for {
		snap := d.snapshot(since)
		if snap.Time != 0 {
			since = snap.Time
		}
		b, _ := json.Marshal(snap)
		if _, err := w.Write(append(append([]byte("event: snapshot\ndata: "), b...), "\n\n"...)); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		if !d.waitTick(w, rc, r, s, tick.C, expired) {
			return
		}
	}
}

// waitTick waits for the stream's next tick; false, once it has written
// the "expired" event if that is why, when the stream must end: the
// session expired or was logged out, the client left, the dashboard
// closed.
func (d *Dashboard) waitTick(w http.ResponseWriter, rc *http.ResponseController, r *http.Request, s session, tick, expired <-chan time.Time) bool {
	for {
		ok, changed := d.sessions.live(s)
		if !ok {
			return endExpired(w, rc)
		}
		select {
		case <-tick:
			return true
		case <-changed: // a logout, this session's perhaps: check again
		case <-expired:
			return endExpired(w, rc)
		case <-r.Context().Done():
			return false
		case <-d.done:
			return false
		}
	}
}

// endExpired tells the page its session is over (it logs in again), and
// returns false: the stream ends.
func endExpired(w http.ResponseWriter, rc *http.ResponseController) bool {
	w.Write([]byte("event: expired\ndata: {}\n\n")) //nolint:errcheck
	rc.Flush()                                      //nolint:errcheck
	return false
}
