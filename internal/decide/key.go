package decide

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/floodgate/floodgate/rules"
)

// StoreKey is the store key of a descriptor's key in domain: the domain,
// NUL, and the key bounded (BoundKey). Every front door (serve, the
// middleware, the proxy) and the admin API use it, so that they count a
// descriptor under one key on a shared store.
func StoreKey(domain, key string) string {
	return domain + "\x00" + BoundKey(key)
}

// SplitStoreKey is StoreKey's inverse: the domain and the (bounded) key.
func SplitStoreKey(k string) (domain, key string, ok bool) {
	return strings.Cut(k, "\x00")
}

// BoundKey returns k if it is at most MaxKeyBytes long, and otherwise its
// first MaxKeyBytes-65 bytes, "#" and the hex SHA-256 of the whole: keys of
// bounded size in the store, whatever the values clients send, and still
// one key per distinct value. A bounded key is its own bound.
func BoundKey(k string) string {
	if len(k) <= MaxKeyBytes {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	n := MaxKeyBytes - 65
	for n > 0 && !utf8.RuneStart(k[n]) { // keep whole characters
		n--
	}
	return k[:n] + "#" + hex.EncodeToString(sum[:])
}

// EntryKey is the key of a descriptor no rule decides (its own limit):
// its entries, quoted, joined by '|'.
func EntryKey(es []rules.Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(strconv.Quote(e.Key))
		b.WriteByte('=')
		b.WriteString(strconv.Quote(e.Value))
	}
	return b.String()
}
