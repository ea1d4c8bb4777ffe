package main

import (
	"fmt"
	"log/slog"
	"math"
	"regexp"
)

// minAdminTokenBits is the least estimated strength (adminTokenBits) of an
// admin token beyond loopback.
const minAdminTokenBits = 128

// makeToken says how to make a good token, for messages.
const makeToken = "make one with `openssl rand -hex 32` or `head -c 32 /dev/urandom | base64`"

var uuidShape = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// adminTokenBits estimates the entropy of tok in bits, as if its
// characters were drawn at random from the classes they come from:
// length × log2(alphabet), the alphabet being 10 for digits, 26 for each
// case of letters present (6 when every letter is a hex digit, a to f),
// and one for each distinct other character. So 32 hex digits are 128
// bits, 22 base64 characters 131 or 132. A token with fewer than 8
// distinct characters (aaaa…, 0123401234…) is 0 bits, and a UUID is
// 122 (a version-4 UUID's random bits; the estimate would say 147). The
// estimate cannot tell a random token from a chosen one (words, a name):
// generate tokens.
func adminTokenBits(tok string) float64 {
	distinct := map[rune]bool{}
	for _, c := range tok {
		distinct[c] = true
	}
	if len(distinct) < 8 {
		return 0
	}
	if uuidShape.MatchString(tok) {
		return 122
	}
	return float64(len(tok)) * math.Log2(float64(alphabetSize(distinct)))
}

// alphabetSize is the size of the alphabet the distinct characters are
// drawn from, as adminTokenBits counts it.
func alphabetSize(distinct map[rune]bool) int {
	var digit, lower, upper, wideLetter bool
	others := 0
	for c := range distinct {
		switch {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'z':
			lower = true
			wideLetter = wideLetter || c > 'f'
		case c >= 'A' && c <= 'Z':
			upper = true
			wideLetter = wideLetter || c > 'F'
		default:
			others++
		}
	}
	perCase := 6
	if wideLetter {
		perCase = 26
	}
	alphabet := others
	if digit {
		alphabet += 10
	}
	if lower {
		alphabet += perCase
	}
	if upper {
		alphabet += perCase
	}
	return alphabet
}

// checkAdminToken refuses a token weaker than minAdminTokenBits for an
// admin API at addr beyond loopback; on loopback (this host's processes
// only) it takes one with a warning. No token at all is prepare's concern.
func checkAdminToken(addr, token string, log *slog.Logger) error {
	bits := adminTokenBits(token)
	if token == "" || bits >= minAdminTokenBits {
		return nil
	}
	if !isLoopback(addr) {
		return fmt.Errorf("--admin-token (or FLOODGATE_ADMIN_TOKEN) is too weak for an admin API beyond loopback (--admin-addr %s): about %.0f bits by Floodgate's estimate, want at least %d bits (32 random hex digits, 22 random base64 characters); %s", addr, bits, minAdminTokenBits, makeToken)
	}
	log.Warn(fmt.Sprintf("the admin token is weaker than %d bits (about %.0f by Floodgate's estimate): taken because the admin API is on loopback, refused beyond it; %s", minAdminTokenBits, bits, makeToken), "addr", addr)
	return nil
}
