package lease

// expHeap is a min-heap of entries by their next lease expiry, each entry
// knowing its index: the Table processes expiries in order, in O(log n).
type expHeap []*entry

func (h *expHeap) push(e *entry) {
	e.hidx = len(*h)
	*h = append(*h, e)
	h.up(e.hidx)
}

func (h *expHeap) remove(e *entry) {
	i, last := e.hidx, len(*h)-1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	e.hidx = -1
	if i != last {
		h.fixAt(i)
	}
}

func (h *expHeap) fix(e *entry) { h.fixAt(e.hidx) }

func (h *expHeap) fixAt(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h expHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}

func (h expHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[p].next <= h[i].next {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts i down, reporting whether it moved.
func (h expHeap) down(i int) bool {
	start := i
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h[r].next < h[l].next {
			m = r
		}
		if h[i].next <= h[m].next {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}
