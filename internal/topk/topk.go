// Package topk finds the heaviest keys of a stream in fixed memory: the
// Space-Saving summary (Metwally, Agrawal, El Abbadi, "Efficient
// Computation of Frequent and Top-k Elements in Data Streams", 2005).
//
// A summary of capacity c keeps at most c keys, each with a count and an
// error bound. A key not kept takes over the slot of the least counted one
// and inherits its count as its error: so a count never understates a
// key's true count, and overstates it by at most its Error. Every key
// whose true count exceeds (total of the stream)/c is kept. The least
// counted slot is found with a min-heap: Add costs O(log c), and once the
// summary is full it allocates nothing but what the caller's map insert
// of a new key may take.
//
// A Summary is not safe for concurrent use: callers lock.
package topk

import "sort"

// Summary is a Space-Saving summary of keys and their counts.
type Summary = Tagged[struct{}]

// New returns an empty summary keeping at most capacity keys (at least 1).
func New(capacity int) *Summary { return NewTagged[struct{}](capacity) }

// An Entry is a kept key: its estimated count and the error bound of that
// estimate. The key's true count is between Count-Error and Count.
type Entry[T any] struct {
	Key   string
	Count uint64 // estimated count: never below the true count
	Error uint64 // how much Count may overstate the true count
	// Tag is the caller's data about the key (Tagged.AddTag), zero when
	// the key took its slot over.
	Tag T
}

// Tagged is a Space-Saving summary whose keys each carry a value of type
// T for the caller (a split of the count by outcome, say), reset to T's
// zero value whenever the key's slot is taken over by another key.
type Tagged[T any] struct {
	capacity int
	heap     []*node[T]          // a min-heap by Count
	index    map[string]*node[T] // by key
	free     []*node[T]          // unused nodes (Reset), reused
	total    uint64              // every count added
}

// node is a kept key and its place in the heap (kept in the node, so that
// moving it writes no map entry).
type node[T any] struct {
	Entry[T]
	pos int
}

// NewTagged returns an empty tagged summary keeping at most capacity keys
// (at least 1).
func NewTagged[T any](capacity int) *Tagged[T] {
	capacity = max(capacity, 1)
	return &Tagged[T]{capacity: capacity, index: make(map[string]*node[T], capacity)}
}

// Capacity returns the most keys the summary keeps.
func (s *Tagged[T]) Capacity() int { return s.capacity }

// Len returns the number of keys kept.
func (s *Tagged[T]) Len() int { return len(s.heap) }

// Total returns the sum of every n added.
func (s *Tagged[T]) Total() uint64 { return s.total }

// Add counts n occurrences of key.
func (s *Tagged[T]) Add(key string, n uint64) { s.AddTag(key, n) }

// AddTag counts n occurrences of key and returns its tag, for the caller
// to update; the pointer is valid until the next call on the summary.
func (s *Tagged[T]) AddTag(key string, n uint64) *T {
	s.total += n
	if e, ok := s.index[key]; ok {
		e.Count += n
		s.down(e.pos)
		return &e.Tag
	}
	if len(s.heap) < s.capacity {
		var e *node[T]
		if k := len(s.free); k > 0 {
			e, s.free = s.free[k-1], s.free[:k-1]
		} else {
			e = new(node[T])
		}
		*e = node[T]{Entry: Entry[T]{Key: key, Count: n}, pos: len(s.heap)}
		s.heap = append(s.heap, e)
		s.index[key] = e
		s.up(e.pos)
		return &e.Tag
	}
	// Take over the least counted slot: the newcomer inherits its count
	// as its error.
	e := s.heap[0]
	delete(s.index, e.Key)
	var zero T
	e.Key, e.Error, e.Tag = key, e.Count, zero
	e.Count += n
	s.index[key] = e
	s.down(0)
	return &e.Tag
}

// Top returns up to n kept keys, the most counted first (ties by key), as
// copies. n <= 0 returns them all.
func (s *Tagged[T]) Top(n int) []Entry[T] {
	out := make([]Entry[T], len(s.heap))
	for i, e := range s.heap {
		out[i] = e.Entry
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Key < out[j].Key
	})
	if n > 0 && n < len(out) {
		out = out[:n:n]
	}
	return out
}

// Reset empties the summary, keeping its memory for reuse.
func (s *Tagged[T]) Reset() {
	for _, e := range s.heap {
		*e = node[T]{}
		s.free = append(s.free, e)
	}
	s.heap = s.heap[:0]
	clear(s.index)
	s.total = 0
}

func (s *Tagged[T]) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.heap[i].pos, s.heap[j].pos = i, j
}

func (s *Tagged[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.heap[p].Count <= s.heap[i].Count {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Tagged[T]) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.heap[r].Count < s.heap[l].Count {
			m = r
		}
		if s.heap[i].Count <= s.heap[m].Count {
			return
		}
		s.swap(i, m)
		i = m
	}
}
