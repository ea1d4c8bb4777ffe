package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/floodgate/floodgate"
)

// The coalescer's calls go to PackedFunction (92_packed.lua): the same
// decisions as BatchFunction on the same keys and values, in a call Redis
// runs for less. Its arguments are two strings, the batch's policies and
// its decisions (each argument costs Redis about 1.5k instructions before
// any Lua runs: a batch of three policies and three decisions took 13),
// and its reply one string. A decision of the Envoy request (OpAllow of a
// small cost on Redis's clock, no calendar rule) is a 4-byte record, and
// when its policy is one fixed window it is made inline, the key's count
// read and written in place. See docs/REDIS.md and docs/BENCHMARKS.md
// (issue 19, exact mode).

// packedStatic returns a policy's part of PackedFunction's first
// argument: its rule count, then each rule's name and signature after its
// length (uint16, big-endian); nil when a name or signature is too long
// for that (the batch then goes to BatchFunction).
func (pa *policyArgs) packedStatic() []byte {
	var b []byte
	b = append(b, byte(len(pa.rules)))
	for i := range pa.rules {
		for _, f := range pa.static[i*ruleFields : i*ruleFields+2] {
			if len(f) > 0xffff {
				return nil
			}
			b = binary.BigEndian.AppendUint16(b, uint16(len(f)))
			b = append(b, f...)
		}
	}
	return b
}

// packedArgs returns the keys and the two arguments of PackedFunction
// deciding the n decisions of batch, or ok false when a policy cannot be
// sent so (BatchFunction then decides them).
func packedArgs(batch []*waiter, n int) (keys, args []string, ok bool) {
	var pols []*policyArgs
	var pb []byte
	keys = make([]string, 0, n)
	rec := make([]byte, 0, 4*n)
	for wi, w := range batch {
		keys = append(keys, w.keys...)
		for j, pa := range w.pas {
			pi := slices.Index(pols, pa)
			if pi < 0 {
				if pa.packed == nil || len(pols) == 255 {
					return nil, nil, false
				}
				pols = append(pols, pa)
				pb = append(pb, pa.packed...)
				pi = len(pols) - 1
			}
			var g byte
			if w.grp != nil && w.grp[j] {
				g = byte(1 + wi%250) // next waiters' groups differ
			}
			rec = appendRecord(rec, byte(pi+1), g, pa, &w.nums[j])
		}
	}
	return keys, []string{string(pb), string(rec)}, true
}

// appendRecord appends one decision's record: 4 bytes for OpAllow of a
// cost of 1 to 255 on Redis's clock with no delay, spare mask or calendar
// rule; else its numbers, as BatchFunction's.
func appendRecord(b []byte, policy, group byte, pa *policyArgs, o *opNums) []byte {
	v := &o.v
	if v[0] == 0 && v[1] == int64(floodgate.OpAllow) && v[2] >= 1 && v[2] <= 255 && v[3] == 0 && v[4] == 0 && !pa.cal {
		return append(b, 0, policy, group, byte(v[2]))
	}
	b = append(b, 1, policy, group)
	for _, x := range v {
		b = binary.BigEndian.AppendUint64(b, uint64(x))
	}
	for _, x := range o.cal {
		b = binary.BigEndian.AppendUint64(b, uint64(x))
	}
	return b
}

var errPackedReply = errors.New("redisstore: malformed reply of the packed batch function")

// packedDecision reads one decision's record at the head of b (a
// PackedFunction reply) and returns it, its error (that decision's
// alone), and the rest of b; a malformed reply is an error of the call.
func packedDecision(pa *policyArgs, b []byte) (floodgate.Decision, error, []byte, error) {
	if len(b) == 0 {
		return floodgate.Decision{}, nil, nil, errPackedReply
	}
	switch b[0] {
	case 0, 1:
		if len(b) < 17 {
			return floodgate.Decision{}, nil, nil, errPackedReply
		}
		d := floodgate.Decision{
			Allowed:    b[0] == 1,
			Limit:      pa.rules[0].Limit,
			Remaining:  int64(binary.BigEndian.Uint64(b[1:9])),
			ResetAfter: time.Duration(binary.BigEndian.Uint64(b[9:17])) * time.Microsecond,
			Rule:       pa.names[0],
		}
		if !d.Allowed {
			d.RetryAfter, d.Reason = d.ResetAfter, floodgate.ReasonLimited
		}
		return d, nil, b[17:], nil
	case 2:
		if len(b) < 1+batchReplySize {
			return floodgate.Decision{}, nil, nil, errPackedReply
		}
		d, err := pa.result(unpackNums(b[1 : 1+batchReplySize]))
		return d, err, b[1+batchReplySize:], nil
	case 3:
		if len(b) < 3 {
			return floodgate.Decision{}, nil, nil, errPackedReply
		}
		n := int(binary.BigEndian.Uint16(b[1:3]))
		if len(b) < 3+n {
			return floodgate.Decision{}, nil, nil, errPackedReply
		}
		return floodgate.Decision{}, fmt.Errorf("redisstore: %s", b[3:3+n]), b[3+n:], nil
	}
	return floodgate.Decision{}, nil, nil, errPackedReply
}

// unpackNums reads batch's 52 bytes (four values of one byte, six of
// eight, big-endian) into Function's ten numbers.
func unpackNums(b []byte) []int64 {
	v := make([]int64, 10)
	for k := range 4 {
		v[k] = int64(b[k])
	}
	for k := range 6 {
		v[4+k] = int64(binary.BigEndian.Uint64(b[4+8*k : 12+8*k]))
	}
	return v
}
