package overrides

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Which domains have no overrides at all, so that a Cache answers their
// lookups (the usual case: most domains have none) without its lock, its
// map, or Redis.
//
// A domain is known to have none when an EXISTS of its hash found nothing
// less than domainCheckEvery ago and no change to it has been heard of
// since: a write through this store, a change announced on the channel
// (when a Cache watches it), or a resubscription (changes may have been
// missed). Each change bumps the domain's version, and a check counts only
// if the version it started under is still current, so a write racing a
// check is never hidden. Checks run in the background, at most one per
// domain at a time; until one has answered, the domain may have overrides.
// Without a watch, other instances' writes show within domainCheckEvery,
// sooner than a Cache's cached absences, which last its negative TTL.

// domainCheckEvery is how long a check that found no overrides holds.
const domainCheckEvery = time.Second

// maxKnownDomains bounds the domains tracked; lookups in others always go
// through the cache.
const maxKnownDomains = 4096

type redisDomain struct {
	version  atomic.Uint64
	none     atomic.Pointer[noneMark]
	checking atomic.Bool
}

// noneMark records a check that found no overrides.
type noneMark struct {
	version uint64 // the domain's version when the check began
	at      int64  // when it began (Unix ns)
}

type redisDomains struct {
	m sync.Map // domain → *redisDomain
	n atomic.Int64
}

// MayHave reports whether domain may have overrides; false means a recent
// check found none and no change has been heard of since (see above).
func (r *Redis) MayHave(domain string) bool {
	v, ok := r.domains.m.Load(domain)
	if !ok {
		if r.domains.n.Load() >= maxKnownDomains {
			return true
		}
		var loaded bool
		v, loaded = r.domains.m.LoadOrStore(domain, new(redisDomain))
		if !loaded {
			r.domains.n.Add(1)
		}
	}
	d := v.(*redisDomain)
	if m := d.none.Load(); m != nil && m.version == d.version.Load() && r.now().UnixNano()-m.at < int64(domainCheckEvery) {
		return false
	}
	if d.checking.CompareAndSwap(false, true) {
		go func() {
			defer d.checking.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			r.checkDomain(ctx, domain, d)
		}()
	}
	return true
}

// checkDomain asks Redis whether domain has any override, and records the
// answer under the version the check began with.
func (r *Redis) checkDomain(ctx context.Context, domain string, d *redisDomain) {
	ver, at := d.version.Load(), r.now().UnixNano()
	n, err := r.c.Do(ctx, r.c.B().Exists().Key(r.keys(domain)[0]).Build()).AsInt64()
	switch {
	case err != nil:
		return
	case n == 0:
		d.none.Store(&noneMark{version: ver, at: at})
	default:
		d.none.Store(nil)
	}
}

// changed records a change to domain's overrides (after it is in Redis).
func (r *Redis) changed(domain string) {
	if v, ok := r.domains.m.Load(domain); ok {
		v.(*redisDomain).version.Add(1)
	}
}

// changedAll records that any domain may have changed.
func (r *Redis) changedAll() {
	r.domains.m.Range(func(_, v any) bool {
		v.(*redisDomain).version.Add(1)
		return true
	})
}
