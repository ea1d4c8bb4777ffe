// Package spanjson is an OpenTelemetry span exporter that writes each span
// as one line of JSON: the binary's --trace-file. It stands in for an OTLP
// exporter, whose modules the project does not take in (docs/SERVICE.md
// "Traces"); a collector's filelog receiver, or jq, reads its lines.
package spanjson

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Span is one line: a span as the exporter writes it.
type Span struct {
	Name         string         `json:"name"`
	Kind         string         `json:"kind"`
	TraceID      string         `json:"trace_id"`
	SpanID       string         `json:"span_id"`
	ParentSpanID string         `json:"parent_span_id,omitempty"`
	Start        time.Time      `json:"start"`
	DurationUS   int64          `json:"duration_us"`
	Status       string         `json:"status"`
	Error        string         `json:"error,omitempty"`
	Attributes   map[string]any `json:"attributes"`
}

// Exporter writes spans to a writer, one JSON object a line. It is safe
// for concurrent use.
type Exporter struct {
	mu     sync.Mutex
	w      io.Writer
	enc    *json.Encoder
	closed bool
}

// New returns an exporter writing to w.
func New(w io.Writer) *Exporter { return &Exporter{w: w, enc: json.NewEncoder(w)} }

// ExportSpans writes spans (sdktrace.SpanExporter).
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	for _, s := range spans {
		if err := e.enc.Encode(convert(s)); err != nil {
			return err
		}
	}
	return nil
}

// Shutdown stops writing; the writer stays the caller's to close.
func (e *Exporter) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}

func convert(s sdktrace.ReadOnlySpan) Span {
	out := Span{
		Name: s.Name(), Kind: s.SpanKind().String(),
		TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
		Start: s.StartTime().UTC(), DurationUS: s.EndTime().Sub(s.StartTime()).Microseconds(),
		Status: s.Status().Code.String(), Error: s.Status().Description,
		Attributes: make(map[string]any, len(s.Attributes())),
	}
	if p := s.Parent(); p.IsValid() {
		out.ParentSpanID = p.SpanID().String()
	}
	for _, kv := range s.Attributes() {
		out.Attributes[string(kv.Key)] = kv.Value.AsInterface()
	}
	return out
}
