// Package server is Floodgate's capacity server: the
// floodgate.capacity.v1.Capacity gRPC service (capacity/capacitypb) over a
// lease table, which shares each resource's global capacity among the
// clients that ask for it and hands out leases on their shares.
//
// A Server is embeddable: open it on a resources file, register it on a
// grpc.Server, and serve.
//
//	srv, err := server.Open("resources.yaml", server.Options{})
//	...
//	gs := grpc.NewServer()
//	srv.Register(gs)
//	gs.Serve(listener)
//
// Three roles combine:
//   - a root server grants its resources' configured capacity;
//   - an intermediate (RunParent) asks its parent for its own clients'
//     aggregate demand, and grants no more, and for no longer, than the
//     parent granted it;
//   - replicas of one server elect a master (SetMastership, fed by an
//     election such as etcd's): the others answer every call with the
//     master's address and no leases, and a new master starts in learning
//     mode so that it never grants what the old master's leases still hold.
//
// Reload re-reads the resources file, whole or nothing. Collector exports
// Prometheus metrics per resource.
package server

import (
	"errors"
	"log/slog"
	"sync"

	"google.golang.org/grpc"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// Defaults of Options.
const (
	// DefaultMaxResources is how many resources one call may name.
	DefaultMaxResources = 1000
	// MaxIDLength bounds a client, server or resource id, in bytes (the
	// table's bound).
	MaxIDLength = lease.MaxResourceLen
)

// Options configure a Server. The zero value serves a single master with
// the system clock.
type Options struct {
	// Clock is the time source; nil: the system clock. Tests use a
	// clock.Manual.
	Clock floodgate.Clock
	// Logger, default slog.Default().
	Logger *slog.Logger
	// MaxResources bounds the resources in one call (GetCapacity,
	// ReleaseCapacity, GetServerCapacity); 0: DefaultMaxResources.
	MaxResources int
	// MaxClients bounds the clients the table tracks (a client counted
	// once per resource); 0: the table's default.
	MaxClients int
	// Intermediate makes the server an intermediate one: its capacity comes
	// only from its parent (RunParent), 0 until the parent answers.
	Intermediate bool
	// Replica makes the server start as a non-master replica that knows no
	// master, until SetMastership says otherwise. Without it the server is
	// the master from the start (a single server, the default).
	Replica bool
	// OnReload, if set, is called with each configuration Reload puts live
	// (for a service sharing the table, such as RLQS).
	OnReload func(*lease.Config)
}

// A Server serves the Capacity service over a lease table. It is safe for
// concurrent use.
type Server struct {
	capacitypb.UnimplementedCapacityServer

	file      string // the resources file, "" for New
	stateFile string // PersistLeases's watermark file, "" without
	opts      Options
	clock     floodgate.Clock
	log       *slog.Logger
	table     *lease.Table
	metrics   *metrics

	mu       sync.RWMutex
	cfg      *lease.Config
	isMaster bool
	master   string // the master's address, "" when unknown (or this one, unadvertised)
}

// Open reads the resources file and returns a Server serving it. Reload
// re-reads the same file.
func Open(file string, opts Options) (*Server, error) {
	cfg, err := lease.LoadConfig(file)
	if err != nil {
		return nil, err
	}
	s := New(cfg, opts)
	s.file = file
	return s, nil
}

// New returns a Server serving cfg.
func New(cfg *lease.Config, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxResources <= 0 {
		opts.MaxResources = DefaultMaxResources
	}
	if opts.Clock == nil {
		opts.Clock = clock.Precise
	}
	s := &Server{opts: opts, clock: opts.Clock, log: opts.Logger, cfg: cfg, isMaster: !opts.Replica,
		table: lease.New(cfg, lease.Options{Clock: opts.Clock, MaxClients: opts.MaxClients, Intermediate: opts.Intermediate})}
	s.metrics = newMetrics(s)
	return s
}

// Register registers the Capacity service on gs.
func (s *Server) Register(gs grpc.ServiceRegistrar) {
	capacitypb.RegisterCapacityServer(gs, s)
}

// Table returns the lease table the server grants from, for another
// service on the same capacity (RLQS).
func (s *Server) Table() *lease.Table { return s.table }

// Config returns the resources configuration live now.
func (s *Server) Config() *lease.Config {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cfg
}

// Reload re-reads the resources file Open read, whole or nothing: on an
// error (which names the file and line) the configuration live before
// stays live, and the error is logged and returned.
func (s *Server) Reload() error {
	if s.file == "" {
		return errors.New("capacity server: Reload needs a server from Open")
	}
	cfg, err := lease.LoadConfig(s.file)
	if err != nil {
		s.log.Error("resources reload refused; the previous resources stay live", "err", err)
		return err
	}
	s.SetConfig(cfg)
	s.log.Info("resources reloaded", "file", s.file, "resources", len(cfg.Resources))
	return nil
}

// SetConfig puts cfg live: new grants follow it, leases already granted
// stand until they expire.
func (s *Server) SetConfig(cfg *lease.Config) {
	s.mu.Lock()
	s.cfg = cfg
	s.mu.Unlock()
	s.table.Reload(cfg)
	if s.opts.OnReload != nil {
		s.opts.OnReload(cfg)
	}
}

// SetMastership says whether this server is the master and, if not, the
// master's address ("" while unknown). On becoming master the table enters
// learning mode: for each resource's learning period it grants clients
// back what they report holding, and newcomers nothing, so that a new
// master never grants what the old master's unexpired leases still hold.
func (s *Server) SetMastership(isMaster bool, master string) {
	s.mu.Lock()
	became := isMaster && !s.isMaster
	s.isMaster, s.master = isMaster, master
	s.mu.Unlock()
	if became {
		s.table.StartLearning()
		s.log.Info("capacity master: learning mode")
	}
}

// Mastership returns whether this server is the master and the master's
// address as last set.
func (s *Server) Mastership() (isMaster bool, master string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.isMaster, s.master
}

// Outstanding returns the capacity of resource in unexpired leases now.
func (s *Server) Outstanding(resource string) float64 { return s.table.Outstanding(resource) }
