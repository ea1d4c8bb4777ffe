package main

import (
	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/throttle"
)

// The dashboard's tracks (recorder.Recorder.Track): store- and
// server-level series beside the decisions per rule.
const (
	// tiersTrack: on a Redis store, the calls to Redis and the decisions
	// answered without one, per second. The store does not say which rule
	// a local decision was for: the track is the store's, not a rule's.
	tiersTrack = "tiers"
	// shedTrack: the requests the proxy's throttler shed, by criticality.
	shedTrack = "shed"
)

// tiersLabels name the tiers track's counters: Redis calls (decisions
// asked of Redis and local share's takes, redisstore.Stats.Calls, as the
// store's health counts them; write-back's pipelined syncs are not in it)
// and the decisions made without one, by the near cache (a refusal it
// remembered: Stats.NearHits), by write-back (Stats.WriteBackLocal) and
// from a local share's slice (Stats.Share.Local).
var tiersLabels = []string{"redis_calls", "near_cache", "write_back", "local_share"}

// trackTiers adds the tiers track of store to rec when it is a Redis
// store (a memory store makes every decision locally: no track).
func trackTiers(rec *recorder.Recorder, store any) {
	rs, ok := store.(*redisstore.Store)
	if !ok || rec == nil {
		return
	}
	rec.Track(tiersTrack, tiersLabels, func(dst []uint64) {
		s := rs.Stats()
		dst[0], dst[1], dst[2], dst[3] = uint64(s.Calls), uint64(s.NearHits), uint64(s.WriteBackLocal), uint64(s.Share.Local)
	})
}

// shedLevels are the criticalities of the shed track, most critical first.
var shedLevels = []throttle.Criticality{throttle.CriticalPlus, throttle.Critical, throttle.SheddablePlus, throttle.Sheddable}

// trackShed adds the shed track of th to rec (nothing without a
// throttler): per criticality, the requests refused with a full queue,
// evicted by a more critical one, or dropped at their deadline, each
// answered 503. Requests whose client left while queued are not counted.
func trackShed(rec *recorder.Recorder, th *throttle.Throttler) {
	if th == nil || rec == nil {
		return
	}
	labels := make([]string, len(shedLevels))
	for i, l := range shedLevels {
		labels[i] = l.String()
	}
	rec.Track(shedTrack, labels, func(dst []uint64) {
		s := th.Stats()
		for i, l := range shedLevels {
			dst[i] = s.Refused[l] + s.Evicted[l] + s.Expired[l]
		}
	})
}
