package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
)

// Bounds of one bulk override write (PUT /v1/overrides): a larger set goes
// in several calls, each all or nothing.
const (
	// MaxBulkOverrides is the most overrides one bulk call takes.
	MaxBulkOverrides = 10_000
	// maxBulkBody caps a bulk call's body: 10,000 overrides of a long key
	// and note each fit.
	maxBulkBody = 32 << 20
)

// bulkRequest is PUT /v1/overrides's body: the overrides, each as GET
// returns one (its domain and key in the object).
type bulkRequest struct {
	Overrides []json.RawMessage `json:"overrides"`
}

// bulkError is a bulk call's answer when one override is bad: the index of
// the first bad one in the request and the field at fault ("" when the
// object itself is), beside the message.
type bulkError struct {
	Error string `json:"error"`
	Index int    `json:"index"`
	Field string `json:"field,omitempty"`
}

// adminBulkPut writes many overrides at once, all or nothing:
//
//	PUT /v1/overrides[?dry_run=true]   {"overrides":[{"domain":"api","key":"user=1","limit":5,"period":"1s"}, ...]}
//
// Every override is read strictly and validated first, as a PUT of one
// would be (its fields, and that its numbers can apply to the limit its key
// matches in the live rules); a domain and key given twice is refused too.
// One bad override writes none: 400 with its index and field. With
// dry_run=true nothing is written either way. Then the batch goes to the
// store in one write (overrides.PutMany: one transaction on bbolt) and each
// key's count is carried to its new numbers, as a PUT of one does. An
// override's "updated" time is kept when given (a restored export keeps its
// times) and stamped now otherwise.
func (s *Service) adminBulkPut(w http.ResponseWriter, r *http.Request) {
	st := s.overridesOr503(w)
	if st == nil {
		return
	}
	batch, raws, ok := s.readBulk(w, r)
	if !ok {
		return
	}
	if dry, _ := strconv.ParseBool(r.URL.Query().Get("dry_run")); dry {
		writeJSON(w, map[string]any{"dry_run": true, "valid": len(batch), "applied": 0})
		return
	}
	s.adminMu.Lock() // as adminPut
	defer s.adminMu.Unlock()
	before := make([]*overrides.Override, len(batch))
	for i, o := range batch {
		if !s.mayCarry(o.Domain, raws[i]) {
			continue
		}
		b, had, err := st.Get(r.Context(), o.Domain, o.Key)
		if err != nil {
			s.storeError(w, r, err)
			return
		}
		if had {
			before[i] = &b
		}
	}
	if err := overrides.PutMany(r.Context(), st, batch); err != nil {
		s.storeError(w, r, err)
		return
	}
	for i := range batch {
		if s.mayCarry(batch[i].Domain, raws[i]) {
			s.carry(r.Context(), batch[i].Domain, raws[i], before[i], &batch[i])
		}
	}
	writeJSON(w, map[string]any{"applied": len(batch)})
}

// readBulk reads and validates a bulk call's overrides, with the raw key
// each was given (before decide.BoundKey). It answers a bad call itself
// (ok false).
func (s *Service) readBulk(w http.ResponseWriter, r *http.Request) (batch []overrides.Override, raws []string, ok bool) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBulkBody))
	dec.DisallowUnknownFields()
	var req bulkRequest
	if err := dec.Decode(&req); err != nil {
		bodyError(w, "body", err)
		return nil, nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		if _, tooBig := errors.AsType[*http.MaxBytesError](err); tooBig {
			bodyError(w, "body", err)
			return nil, nil, false
		}
		httpError(w, http.StatusBadRequest, "body: more after the JSON object")
		return nil, nil, false
	}
	switch {
	case req.Overrides == nil:
		httpError(w, http.StatusBadRequest, `body: want {"overrides":[...]}`)
		return nil, nil, false
	case len(req.Overrides) > MaxBulkOverrides:
		httpError(w, http.StatusRequestEntityTooLarge, "body: %d overrides; at most %d a call", len(req.Overrides), MaxBulkOverrides)
		return nil, nil, false
	}
	now := time.Now().UTC()
	seen := make(map[[2]string]int, len(req.Overrides))
	batch, raws = make([]overrides.Override, len(req.Overrides)), make([]string, len(req.Overrides))
	for i, raw := range req.Overrides {
		o, err := s.bulkOne(raw)
		if err != nil {
			var fe *overrides.FieldError
			field := ""
			if errors.As(err, &fe) {
				field = fe.Field
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(bulkError{Error: fmt.Sprintf("overrides[%d]: %v", i, err), Index: i, Field: field})
			return nil, nil, false
		}
		raws[i] = o.Key
		o.Key = decide.BoundKey(o.Key) // as adminPut stores it
		k := [2]string{o.Domain, o.Key}
		if j, dup := seen[k]; dup {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(bulkError{Error: fmt.Sprintf("overrides[%d]: domain %q key %q is overrides[%d]'s too; one override a key", i, o.Domain, raws[i], j), Index: i, Field: "key"})
			return nil, nil, false
		}
		seen[k] = i
		if o.Updated.IsZero() {
			o.Updated = now
		}
		batch[i] = o
	}
	return batch, raws, true
}

// bulkOne reads and checks one override of a bulk call, as adminPut does
// one; its key is the raw key, not yet bounded.
func (s *Service) bulkOne(raw json.RawMessage) (overrides.Override, error) {
	o, err := overrides.DecodeJSON(bytes.NewReader(raw))
	if err != nil {
		return o, err
	}
	bounded := o
	bounded.Key = decide.BoundKey(o.Key)
	if err := bounded.Validate(); err != nil {
		return o, err
	}
	if err := s.checkOverride(bounded, o.Key); err != nil {
		// the field at fault, as the policy built names it
		field := "limit"
		if re, ok := errors.AsType[*floodgate.RuleError](err); ok && re.Field != "" {
			field = re.Field
		}
		return o, &overrides.FieldError{Domain: o.Domain, Key: o.Key, Field: field, Msg: err.Error()}
	}
	return o, nil
}

// mayCarry reports whether carry could move anything for rawKey in domain:
// the store can move counts and the key matches a limit of the live rules.
// Other keys need no look at their old override.
func (s *Service) mayCarry(domain, rawKey string) bool {
	if _, ok := s.opts.Store.(floodgate.Mover); !ok {
		return false
	}
	cfg := s.rules.Load()
	if cfg == nil {
		return false
	}
	entries, ok := rules.ParseKey(rawKey)
	if !ok {
		return false
	}
	m := cfg.Match(domain, entries)
	return m != nil && m.Limit.Policy != nil && decide.BoundKey(m.Key) == decide.BoundKey(rawKey)
}
