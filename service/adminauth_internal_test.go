package service

import (
	"strings"
	"testing"
)

// tokenEqual answers exactly, whatever the lengths: equal tokens match,
// and a prefix, an extension, a token of the same length differing in one
// byte (first, middle, last), an empty one, and one that only shares its
// SHA-256 input's length do not.
func TestTokenEqual(t *testing.T) {
	const want = "3f9c2a7b1e6d4c8a9b0f5e2d7c1a6b3e"
	for got, eq := range map[string]bool{
		want:                        true,
		want[:len(want)-1]:          false,
		want + "0":                  false,
		"":                          false,
		"x" + want[1:]:              false,
		want[:16] + "x" + want[17:]: false,
		want[:len(want)-1] + "x":    false,
		strings.ToUpper(want):       false,
		strings.Repeat(want, 64):    false,
	} {
		if tokenEqual(got, sumToken(want)) != eq {
			t.Errorf("tokenEqual(%q, the token) = %v, want %v", got, !eq, eq)
		}
	}
	if !tokenEqual("", sumToken("")) {
		t.Error("tokenEqual of two empty tokens is false")
	}
}
