package recorder

// A track is a server- or store-level series: a few cumulative counters,
// read by a function once a second (in Sample), whose gains are kept per
// second for Window seconds. Memory: Window × len(labels) × 4 bytes.
type track struct {
	name   string
	labels []string
	read   func(dst []uint64)
	cur    []uint64
	prev   []uint64
	total  []uint64 // gained since the track was added
	ring   [Window][]uint32
	from   int64 // the first second sampled since the track was added
}

// TrackSeries is a track's gains, one count per label a second from
// Start, and their totals since the track was added.
type TrackSeries struct {
	Name   string     `json:"name"`
	Labels []string   `json:"labels"`
	Start  int64      `json:"start"` // unix seconds of Counts[0]
	Counts [][]uint32 `json:"counts"`
	Total  []uint64   `json:"total"`
}

// Track adds a series named name: read fills dst (len(labels) long) with
// cumulative counters (a store's or a throttler's), once a second in
// Sample, which keeps what each gained per second. What they count before
// Track is not counted. read must not call the recorder.
func (r *Recorder) Track(name string, labels []string, read func(dst []uint64)) {
	t := &track{name: name, labels: labels, read: read, cur: make([]uint64, len(labels)),
		prev: make([]uint64, len(labels)), total: make([]uint64, len(labels))}
	read(t.prev)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tracks = append(r.tracks, t)
}

// sampleTracks moves what the tracks' counters gained into second now;
// r.mu is held, r.last is the previous sample's second.
func (r *Recorder) sampleTracks(now int64) {
	for _, t := range r.tracks {
		t.read(t.cur)
		d := make([]uint32, len(t.cur))
		for i, c := range t.cur {
			g := c - t.prev[i]
			if c < t.prev[i] { // a counter went back (a store reopened): count nothing
				g = 0
			}
			d[i] = uint32(min(g, 1<<32-1))
			t.total[i] += g
			t.prev[i] = c
		}
		if t.from == 0 {
			t.from = now
		}
		if now == r.last {
			if t.ring[now%Window] == nil {
				t.ring[now%Window] = d
				continue
			}
			for i := range d {
				t.ring[now%Window][i] += d[i]
			}
			continue
		}
		for s := max(r.last+1, now-Window+1); r.last != 0 && s < now; s++ {
			t.ring[s%Window] = nil
		}
		t.ring[now%Window] = d
	}
}

// Tracks returns every track's seconds after since up to upto (the last
// second of a Since before: what a snapshot's rules cover), at most
// Window of them.
func (r *Recorder) Tracks(since, upto int64) []TrackSeries {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]TrackSeries, 0, len(r.tracks))
	upto = min(upto, r.last)
	for _, t := range r.tracks {
		ts := TrackSeries{Name: t.name, Labels: t.labels, Total: append([]uint64(nil), t.total...), Counts: [][]uint32{}}
		if t.from != 0 {
			ts.Start = max(since+1, r.last-Window+1, t.from)
			for s := ts.Start; s <= upto; s++ {
				c := make([]uint32, len(t.labels)) // a copy: Sample adds to the ring's
				copy(c, t.ring[s%Window])
				ts.Counts = append(ts.Counts, c)
			}
		}
		out = append(out, ts)
	}
	return out
}
