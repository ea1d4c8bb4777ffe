package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// MaxKeyBytes bounds the bytes of a key as Redis keys hold it: a longer
// one is kept as its SHA-256 digest. Sending megabytes a call would cost
// more than the store's timeout, and each call that timed out so would
// count as Redis failing (Options.BreakerThreshold) for every key.
const MaxKeyBytes = 1024

// Key returns the Redis key holding key's state under policy:
// prefix:1:{key}:policy, with '{', '}' and '%' in key percent-escaped (no
// key can choose its Cluster slot or meet another's), the empty key as
// {%} (an empty hash tag would not be one, and a key's names would land
// in other slots), and a key over MaxKeyBytes as {%s<its SHA-256 in hex>}.
// An escaped key holds '%' only before two hex digits, so none of the
// three forms meets another.
func (s *Store) Key(policy, key string) string {
	var b strings.Builder
	b.Grow(len(s.opts.Prefix) + min(len(key), MaxKeyBytes) + len(policy) + 8)
	b.WriteString(s.opts.Prefix)
	b.WriteString(":1:{")
	switch {
	case key == "":
		b.WriteByte('%')
	case len(key) > MaxKeyBytes:
		sum := sha256.Sum256([]byte(key))
		b.WriteString("%s")
		b.WriteString(hex.EncodeToString(sum[:]))
		key = ""
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		case '%':
			b.WriteString("%25")
		default:
			b.WriteByte(c)
		}
	}
	b.WriteString("}:")
	b.WriteString(policy)
	return b.String()
}

// policyArgs returns p's prepared arguments, kept with p (so they go when
// p does: a map of policies here grew at every reload of the rules).
func (s *Store) policyArgs(p *floodgate.Policy) *policyArgs {
	return storekit.Attached(p, argsKey{}, func() any { return newPolicyArgs(p) }).(*policyArgs)
}

// argsKey is the key of a policy's prepared arguments (storekit.Attached):
// they depend on the policy alone, so every store shares them.
type argsKey struct{}

func (s *Store) scriptArgs(now int64, op *floodgate.Op) (*policyArgs, []string) {
	pa, o := s.nums(now, op)
	return pa, pa.singleArgs(o)
}

// nums returns op's policy arguments and its own numbers.
func (s *Store) nums(now int64, op *floodgate.Op) (*policyArgs, opNums) {
	pa := s.policyArgs(op.Policy)
	t := now
	if !s.opts.ClientTime {
		t = 0
	}
	return pa, pa.nums(t, now, op)
}

// BatchCommand returns the exact Redis command the store sends when it
// decides ops at now together (coalescing; see Command): FCALL of
// PackedFunction, or EVALSHA of PackedScript() on servers without
// functions (BatchFunctionCommand's, for a policy too long for it). It
// loads the library first.
func (s *Store) BatchCommand(ctx context.Context, now int64, ops []floodgate.Op) ([]string, error) {
	w, err := s.commandWaiter(ctx, now, ops)
	if err != nil {
		return nil, err
	}
	keys, args, ok := packedArgs([]*waiter{w}, len(ops))
	if !ok {
		return s.BatchFunctionCommand(ctx, now, ops)
	}
	head := []string{"FCALL", PackedFunction}
	if s.scriptMode.Load() {
		head = []string{"EVALSHA", sha1hex(PackedScript())}
	}
	cmd := append(head, strconv.Itoa(len(keys)))
	cmd = append(cmd, keys...)
	return append(cmd, args...), nil
}

// BatchFunctionCommand returns the command of BatchFunction (the calling
// convention of releases before PackedFunction, which the library keeps)
// deciding ops at now together: FCALL, or EVALSHA of BatchScript() on
// servers without functions. It loads the library first.
func (s *Store) BatchFunctionCommand(ctx context.Context, now int64, ops []floodgate.Op) ([]string, error) {
	w, err := s.commandWaiter(ctx, now, ops)
	if err != nil {
		return nil, err
	}
	keys, args := batchArgs([]*waiter{w}, len(ops))
	head := []string{"FCALL", BatchFunction}
	if s.scriptMode.Load() {
		head = []string{"EVALSHA", sha1hex(BatchScript())}
	}
	cmd := append(head, strconv.Itoa(len(keys)))
	cmd = append(cmd, keys...)
	return append(cmd, args...), nil
}

// commandWaiter loads the library and returns ops at now as one waiter.
func (s *Store) commandWaiter(ctx context.Context, now int64, ops []floodgate.Op) (*waiter, error) {
	if err := s.loadLibrary(ctx); err != nil {
		return nil, err
	}
	w := &waiter{}
	for i := range ops {
		if ops[i].Policy == nil {
			return nil, errNoPolicy
		}
		pa, o := s.nums(now, &ops[i])
		w.add(s.Key(ops[i].Policy.Name(), ops[i].Key), pa, o)
	}
	return w, nil
}

// Command returns the exact Redis command a store without coalescing (a
// Cluster, Options.NoCoalescing; a coalescing store sends BatchCommand's,
// even for one op) sends for op at now
// (now is ignored unless ClientTime): FCALL of the library's function, or
// EVALSHA of Script() on servers without functions, with its key and
// arguments, for tools that replay it (redis-benchmark, bench/). It loads
// the library first.
func (s *Store) Command(ctx context.Context, now int64, op floodgate.Op) ([]string, error) {
	if err := s.loadLibrary(ctx); err != nil {
		return nil, err
	}
	_, args := s.scriptArgs(now, &op)
	key := s.Key(op.Policy.Name(), op.Key)
	if s.scriptMode.Load() {
		return append([]string{"EVALSHA", s.sha(), "1", key}, args...), nil
	}
	return append([]string{"FCALL", Function, "1", key}, args...), nil
}
