package refmodel

import (
	"fmt"
	"math/big"
)

// first returns the least t >= from at which ok holds. ok must be monotone
// over [from, ∞): once true, true at every later instant. It is found by
// doubling a step until ok holds and then bisecting, so it costs about
// 2·log2(t-from) evaluations.
func first(from int64, ok func(int64) bool) int64 {
	if ok(from) {
		return from
	}
	lo := from // ok(lo) is false
	var hi int64
	for step := int64(1); ; step *= 2 {
		if step > 1<<62 {
			panic(fmt.Sprintf("refmodel: no instant after %d satisfies the condition", from))
		}
		hi = from + step
		if ok(hi) {
			break
		}
		lo = hi
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

func rat(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }

// rateTimes returns dt·L/P exactly.
func rateTimes(dt, l, p int64) *big.Rat {
	n := new(big.Int).Mul(big.NewInt(dt), big.NewInt(l))
	return new(big.Rat).SetFrac(n, big.NewInt(p))
}

// floorRat returns ⌊x⌋.
func floorRat(x *big.Rat) int64 {
	q, m := new(big.Int).DivMod(x.Num(), x.Denom(), new(big.Int)) // Euclidean: m >= 0
	_ = m
	return q.Int64()
}

// ceilRat returns ⌈x⌉.
func ceilRat(x *big.Rat) int64 {
	f := floorRat(x)
	if x.IsInt() {
		return f
	}
	return f + 1
}

// floorMulDiv returns ⌊a·b/c⌋ for c > 0, exactly.
func floorMulDiv(a, b, c int64) int64 {
	return floorRat(new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(a), big.NewInt(b)), big.NewInt(c)))
}

// floorDiv returns ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
