package server_test

import (
	"math"
	"math/rand/v2"
	"path"
	"testing"

	"github.com/floodgate/floodgate/capacity/server"
)

// BucketResource sorts the pairs (Envoy's bucket ids are maps: order does
// not matter) and escapes what would make the id ambiguous or let a glob
// cross from the domain into the pairs.
func TestBucketResource(t *testing.T) {
	for _, tc := range []struct {
		domain string
		bucket map[string]string
		want   string
	}{
		{"envoy", map[string]string{"name": "checkout", "env": "prod"}, "envoy/env=prod,name=checkout"},
		{"envoy", map[string]string{"env": "prod", "name": "checkout"}, "envoy/env=prod,name=checkout"},
		{"a/b", map[string]string{"path": "/api/v1", "k=1": "x,y%"}, "a%2Fb/k%3D1=x%2Cy%25,path=%2Fapi%2Fv1"},
		{"envoy", map[string]string{"ctl": "a\nb\x7f"}, "envoy/ctl=a%0Ab%7F"},
		{"ünï", map[string]string{"ключ": "値"}, "ünï/ключ=値"},
	} {
		if got := server.BucketResource(tc.domain, tc.bucket); got != tc.want {
			t.Errorf("BucketResource(%q, %v) = %q, want %q", tc.domain, tc.bucket, got, tc.want)
		}
	}
	// Distinct buckets never share an id: a value holding the separators
	// cannot pass for two pairs.
	a := server.BucketResource("d", map[string]string{"a": "1,b=2"})
	b := server.BucketResource("d", map[string]string{"a": "1", "b": "2"})
	if a == b {
		t.Fatalf("{a: 1,b=2} and {a: 1, b: 2} share the id %q", a)
	}
	// A domain's glob matches every bucket of it, whatever the values.
	id := server.BucketResource("envoy", map[string]string{"path": "/x/y"})
	if ok, _ := path.Match("envoy/*", id); !ok {
		t.Fatalf("envoy/* does not match %q", id)
	}
	if ok, _ := path.Match("env/*", server.BucketResource("env/oy", map[string]string{"k": "v"})); ok {
		t.Fatal("env/* matches a bucket of domain env/oy")
	}
}

// TokenBucket never gives Envoy more than the share (Envoy's rate is
// tokens_per_fill over fill_interval's whole seconds), loses less than a
// token per fill interval, and gives a share of 0 an empty bucket.
func TestTokenBucketNeverOverShare(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100_000; i++ {
		rate := math.Exp(r.Float64()*30 - 10) // e^-10 .. e^20
		fill := int64(1 + r.IntN(10))
		tb := server.TokenBucket(rate, fill)
		got := server.TokenRate(tb)
		if got > rate {
			t.Fatalf("TokenBucket(%v, %d) = %v: rate %v, over the share", rate, fill, tb, got)
		}
		if err := tb.Validate(); err != nil {
			t.Fatalf("TokenBucket(%v, %d) = %v: invalid: %v", rate, fill, tb, err)
		}
		switch {
		case rate*float64(fill) >= 1 && rate*float64(fill) < math.MaxUint32:
			if rate-got >= 1/float64(fill)+1e-9 {
				t.Fatalf("TokenBucket(%v, %d): rate %v, a token per fill interval or more under", rate, fill, got)
			}
			if tb.GetMaxTokens() != tb.GetTokensPerFill().GetValue() {
				t.Fatalf("TokenBucket(%v, %d) = %v: max_tokens is not one fill's tokens", rate, fill, tb)
			}
		case rate >= 1.0/3600:
			if got == 0 {
				t.Fatalf("TokenBucket(%v, %d) = %v: a positive share refuses everything", rate, fill, tb)
			}
		}
	}
	for _, rate := range []float64{0, -1, math.NaN(), 1e-9} {
		if tb := server.TokenBucket(rate, 1); tb.GetMaxTokens() != 0 || tb.Validate() != nil {
			t.Fatalf("TokenBucket(%v) = %v, want a valid empty bucket", rate, tb)
		}
	}
	if tb := server.TokenBucket(math.Inf(1), 1); tb.GetTokensPerFill().GetValue() != math.MaxUint32 {
		t.Fatalf("TokenBucket(+Inf) = %v, want the largest bucket", tb)
	}
}
