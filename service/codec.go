package service

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// lenientCodec is grpc-go's protobuf codec, but for a request whose string
// fields are not valid UTF-8. Proto3 says they must be, and protobuf-go
// refuses to decode such a message; but Envoy copies a client's header into
// a descriptor's value byte for byte, and HTTP allows bytes 0x80-0xFF in
// header values, so a client could send one that fails the call, and Envoy
// lets a request through every limit when its call fails (failure_mode_deny
// false). Such a request is decoded with each byte of an invalid sequence
// written as \xNN, and decided as usual. Distinct invalid values stay
// distinct; one may read as a valid value that spells the escape out (the
// bytes ff fe and the text \xff\xfe share a counter), which gives a
// client nothing it could not have by sending that text.
type lenientCodec struct {
	encoding.CodecV2
}

func newLenientCodec() lenientCodec {
	return lenientCodec{encoding.GetCodecV2(grpcproto.Name)}
}

// Unmarshal decodes data into v; a message refused for invalid UTF-8 alone
// is decoded again with its strings escaped.
func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil || !strings.Contains(err.Error(), "invalid UTF-8") {
		return err
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	fixed, ferr := escapeStrings(nil, data.Materialize(), m.ProtoReflect().Descriptor(), 0)
	if ferr != nil {
		return err
	}
	proto.Reset(m)
	return proto.Unmarshal(fixed, m)
}

// maxDepth bounds the nesting escapeStrings follows (a request's is 4).
const maxDepth = 16

// escapeStrings appends to dst the message b (of type md) with every
// string field made valid UTF-8, and the nested messages likewise.
func escapeStrings(dst, b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			dst = append(dst, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		dst = protowire.AppendTag(dst, num, typ)
		if fd.Kind() == protoreflect.StringKind {
			dst = protowire.AppendBytes(dst, escapeInvalid(v))
		} else {
			inner, err := escapeStrings(nil, v, fd.Message(), depth+1)
			if err != nil {
				return nil, err
			}
			dst = protowire.AppendBytes(dst, inner)
		}
		b = b[n+m:]
	}
	return dst, nil
}

// escapeInvalid returns s with each byte of an invalid UTF-8 sequence
// written as \xNN.
func escapeInvalid(s []byte) []byte {
	return escapeInvalidAs(s, `\x`)
}

// escapeInvalidJSON returns a JSON text with each byte of an invalid UTF-8
// sequence written as \\xNN: inside a string, the \xNN escapeInvalid
// writes (outside one, still a syntax error).
func escapeInvalidJSON(s []byte) []byte {
	return escapeInvalidAs(s, `\\x`)
}

func escapeInvalidAs(s []byte, prefix string) []byte {
	if utf8.Valid(s) {
		return s
	}
	const hex = "0123456789abcdef"
	out := make([]byte, 0, len(s)+16)
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size <= 1 {
			out = append(out, prefix...)
			out = append(out, hex[s[0]>>4], hex[s[0]&15])
			s = s[1:]
			continue
		}
		out = append(out, s[:size]...)
		s = s[size:]
	}
	return out
}
