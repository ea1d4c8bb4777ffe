package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate/internal/spanjson"
)

// traceConfig is --trace-file and --trace-sample: OpenTelemetry spans of
// decisions, as JSON lines (docs/SERVICE.md "Traces"). Off by default.
type traceConfig struct {
	file   string
	sample float64
	tp     trace.TracerProvider // provider's, once made (nil: off)
}

// defaultTraceSample is the share of decisions traced when the caller's
// trace says nothing (a sampled traceparent is always followed).
const defaultTraceSample = 0.01

func (t *traceConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&t.file, "trace-file", envString("TRACE_FILE", ""), "write an OpenTelemetry span per decision to this file, one JSON object a line (appended; - for stderr); off when empty [FLOODGATE_TRACE_FILE]")
	t.sample = defaultTraceSample
	if f, err := strconv.ParseFloat(envString("TRACE_SAMPLE", ""), 64); err == nil {
		t.sample = f
	}
	fs.Float64Var(&t.sample, "trace-sample", t.sample, "with --trace-file: the share of decisions traced, 0 to 1, when the caller's traceparent does not decide (a sampled one is always traced, an unsampled one never) [FLOODGATE_TRACE_SAMPLE]")
}

func (t *traceConfig) check() error {
	if t.sample < 0 || t.sample > 1 || t.sample != t.sample {
		return fmt.Errorf("--trace-sample %v: want 0 to 1", t.sample)
	}
	return nil
}

// provider returns the tracer provider of the flags (nil when off) and
// what flushes and closes it.
func (t *traceConfig) provider(stderr io.Writer, log *slog.Logger) (trace.TracerProvider, func(), error) {
	if t.file == "" {
		return nil, func() {}, nil
	}
	w, closeFile := stderr, func() error { return nil }
	if t.file != "-" {
		f, err := os.OpenFile(t.file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("--trace-file: %w", err)
		}
		w, closeFile = f, f.Close
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(spanjson.New(w)), // a bounded queue: spans beyond it are dropped, never waited for
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.sample))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "floodgate"))),
	)
	log.Info("tracing decisions", "file", t.file, "sample", t.sample)
	return tp, func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			log.Warn("flushing spans", "err", err)
		}
		if err := closeFile(); err != nil {
			log.Warn("closing --trace-file", "err", err)
		}
	}, nil
}
