package overrides

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Bolt keeps overrides in a bbolt file: durable, embedded, one process at
// a time (the file is locked while open).
//
// Layout: a top-level bucket "overrides.v1" holding one nested bucket per
// domain, named by the domain; in it each override is a key (the
// override's Key) whose value is the override's compact binary encoding
// (limit, period, burst, algorithm, note, updated: ~15 bytes plus the
// note). bbolt keeps keys in byte order, so List is a cursor seek. A
// domain's bucket is removed with its last override.
//
// Every Put and Delete is one transaction with one fsync; PutMany writes a
// whole batch in one.
type Bolt struct {
	db  *bolt.DB
	now func() time.Time
	// domains holds the domains that have overrides, in memory: the file
	// is this process's alone, so the set is exact, and a lookup in a
	// domain without overrides (the usual case) needs no transaction.
	domains atomic.Pointer[map[string]struct{}]
}

var rootBucket = []byte("overrides.v1")

// OpenBolt opens (creating if needed) the bbolt file at path. It fails
// after a second if another process holds the file.
func OpenBolt(path string) (*Bolt, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("overrides: open %s: the file is in use by another process", path)
		}
		return nil, fmt.Errorf("overrides: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(rootBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("overrides: open %s: %w", path, err)
	}
	b := &Bolt{db: db, now: time.Now}
	if err := b.refreshDomains(); err != nil {
		db.Close()
		return nil, fmt.Errorf("overrides: open %s: %w", path, err)
	}
	return b, nil
}

// refreshDomains reads the set of domains with overrides.
func (b *Bolt) refreshDomains() error {
	set := map[string]struct{}{}
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(rootBucket).ForEachBucket(func(k []byte) error {
			set[string(k)] = struct{}{}
			return nil
		})
	})
	if err != nil {
		return err
	}
	b.domains.Store(&set)
	return nil
}

// update runs a write transaction and then refreshes the domain set.
func (b *Bolt) update(fn func(tx *bolt.Tx) error) error {
	err := b.db.Update(fn)
	if rerr := b.refreshDomains(); err == nil {
		err = rerr
	}
	return err
}

// MayHave reports whether domain has any override; false is exact (the
// Cache answers such lookups without asking).
func (b *Bolt) MayHave(domain string) bool {
	set := b.domains.Load()
	if set == nil {
		return true
	}
	_, ok := (*set)[domain]
	return ok
}

// Path returns the file's path.
func (b *Bolt) Path() string { return b.db.Path() }

// Close closes the file.
func (b *Bolt) Close() error { return b.db.Close() }

// Put writes o.
func (b *Bolt) Put(ctx context.Context, o Override) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	one := []Override{o}
	if err := prepare(one, b.now()); err != nil {
		return err
	}
	o = one[0]
	return b.update(func(tx *bolt.Tx) error {
		d, err := tx.Bucket(rootBucket).CreateBucketIfNotExists([]byte(o.Domain))
		if err != nil {
			return err
		}
		return d.Put([]byte(o.Key), encodeValue(nil, o))
	})
}

// PutMany writes batch in one transaction, in key order within each domain
// (so bbolt fills its pages densely); none when one is invalid.
func (b *Bolt) PutMany(ctx context.Context, batch []Override) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(batch) == 0 {
		return nil
	}
	batch = slices.Clone(batch)
	if err := prepare(batch, b.now()); err != nil {
		return err
	}
	slices.SortStableFunc(batch, func(x, y Override) int {
		if c := strings.Compare(x.Domain, y.Domain); c != 0 {
			return c
		}
		return strings.Compare(x.Key, y.Key)
	})
	return b.update(func(tx *bolt.Tx) error {
		root := tx.Bucket(rootBucket)
		var d *bolt.Bucket
		// bbolt keeps the slices given to Put until the transaction ends:
		// encode every value into one arena, each in its own part.
		arena := make([]byte, 0, 32*len(batch))
		for i, o := range batch {
			if i == 0 || o.Domain != batch[i-1].Domain {
				var err error
				if d, err = root.CreateBucketIfNotExists([]byte(o.Domain)); err != nil {
					return err
				}
				// Keys arriving in order after the bucket's last key (an
				// import in key order) fill their pages completely: half
				// the file. Otherwise bbolt's default (half full pages)
				// leaves room for keys to come in between.
				if last, _ := d.Cursor().Last(); last == nil || string(last) < batch[i].Key {
					d.FillPercent = 1
				}
			}
			start := len(arena)
			arena = encodeValue(arena, o)
			if err := d.Put([]byte(o.Key), arena[start:len(arena):len(arena)]); err != nil {
				return err
			}
		}
		return nil
	})
}

// Get returns the override of key in domain.
func (b *Bolt) Get(ctx context.Context, domain, key string) (o Override, ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return Override{}, false, err
	}
	if domain == "" || key == "" {
		return Override{}, false, nil
	}
	err = b.db.View(func(tx *bolt.Tx) error {
		d := tx.Bucket(rootBucket).Bucket([]byte(domain))
		if d == nil {
			return nil
		}
		v := d.Get([]byte(key))
		if v == nil {
			return nil
		}
		var err error
		o, err = decodeValue(domain, key, v)
		ok = err == nil
		return err
	})
	return o, ok, err
}

// Delete removes the override of key in domain.
func (b *Bolt) Delete(ctx context.Context, domain, key string) (found bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if domain == "" || key == "" {
		return false, nil
	}
	err = b.update(func(tx *bolt.Tx) error {
		root := tx.Bucket(rootBucket)
		d := root.Bucket([]byte(domain))
		if d == nil || d.Get([]byte(key)) == nil {
			return nil
		}
		found = true
		if err := d.Delete([]byte(key)); err != nil {
			return err
		}
		if k, _ := d.Cursor().First(); k == nil {
			return root.DeleteBucket([]byte(domain))
		}
		return nil
	})
	return found, err
}

// List returns a page of domain's overrides in key order.
func (b *Bolt) List(ctx context.Context, domain, after string, limit int) ([]Override, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit = normLimit(limit)
	var out []Override
	err := b.db.View(func(tx *bolt.Tx) error {
		d := tx.Bucket(rootBucket).Bucket([]byte(domain))
		if d == nil {
			return nil
		}
		c := d.Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && after != "" && bytes.Equal(k, []byte(after)) {
			k, v = c.Next()
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			if v == nil {
				continue // a nested bucket: none are written
			}
			o, err := decodeValue(domain, string(k), v)
			if err != nil {
				return err
			}
			out = append(out, o)
		}
		return nil
	})
	return out, err
}

// Domains returns the domains that have overrides, in byte order.
func (b *Bolt) Domains(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []string
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(rootBucket).ForEachBucket(func(k []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}

// Count returns how many overrides domain has.
func (b *Bolt) Count(ctx context.Context, domain string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := b.db.View(func(tx *bolt.Tx) error {
		if d := tx.Bucket(rootBucket).Bucket([]byte(domain)); d != nil {
			n = d.Stats().KeyN
		}
		return nil
	})
	return n, err
}
