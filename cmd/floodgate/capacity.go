package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	capserver "github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/elect"
	"github.com/floodgate/floodgate/internal/lease"
	"github.com/floodgate/floodgate/service"
)

// capacityConfig is what `floodgate serve` is told about capacity leases
// (docs/CAPACITY.md). Without --resources there is no lease service.
type capacityConfig struct {
	resources   string // the resources file
	parent      string // an intermediate's parent address
	parentCA    string // TLS to the parent, verified with this CA
	serverID    string // this server's id towards its parent
	etcd        string // comma-separated etcd client URLs: replicas elect a master
	advertise   string // the address this replica advertises as master
	electionKey string
	etcdTTL     int
	state       string // the lease watermark file (single server); "" : in the data directory
	dataDir     string // serve's --data
}

// stateFile is the lease watermark file of a single server (none with
// --etcd: a new master learns on election).
func (c *capacityConfig) stateFile() string {
	switch {
	case c.etcd != "":
		return ""
	case c.state != "":
		return c.state
	}
	return filepath.Join(c.dataDir, "capacity.state")
}

func (c *capacityConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.resources, "resources", envString("RESOURCES", ""), "capacity leases: the resources file (docs/CAPACITY.md); serves the floodgate.capacity.v1.Capacity service on the gRPC port. Empty: no lease service [FLOODGATE_RESOURCES]")
	fs.StringVar(&c.parent, "parent", envString("PARENT", ""), "capacity leases: the parent server's gRPC address, HOST:PORT (a replicated parent's addresses, comma-separated); this server then grants only what its parent grants it [FLOODGATE_PARENT]")
	fs.StringVar(&c.parentCA, "parent-tls-ca", envString("PARENT_TLS_CA", ""), "capacity leases: speak TLS to --parent, verifying its certificate with this CA (PEM); this server's --tls-cert, if any, is its client certificate [FLOODGATE_PARENT_TLS_CA]")
	fs.StringVar(&c.serverID, "server-id", envString("SERVER_ID", ""), "capacity leases: this server's id towards its parent (default: --advertise, else the host name and --grpc-addr) [FLOODGATE_SERVER_ID]")
	fs.StringVar(&c.etcd, "etcd", envString("ETCD", ""), "capacity leases: etcd client URLs, comma-separated; the replicas sharing them elect one master (needs --advertise) [FLOODGATE_ETCD]")
	fs.StringVar(&c.advertise, "advertise", envString("ADVERTISE", ""), "capacity leases: the gRPC address clients reach this replica at, HOST:PORT, sent to them as the master's address [FLOODGATE_ADVERTISE]")
	fs.StringVar(&c.electionKey, "election-key", envString("ELECTION_KEY", "/floodgate/capacity/master"), "capacity leases: the etcd key prefix of the master election; one per replicated service [FLOODGATE_ELECTION_KEY]")
	fs.StringVar(&c.state, "capacity-state", envString("CAPACITY_STATE", ""), "capacity leases: the file where a single server (no --etcd) keeps its lease watermark, so that after a restart it does not grant again what its unexpired leases hold (default: capacity.state in --data) [FLOODGATE_CAPACITY_STATE]")
	c.etcdTTL = envInt("ETCD_TTL", 5)
	fs.IntVar(&c.etcdTTL, "etcd-ttl", c.etcdTTL, "capacity leases: the election session's TTL in seconds: how long a dead master stays master [FLOODGATE_ETCD_TTL]")
}

func (c *capacityConfig) check() error {
	switch {
	case c.resources == "" && (c.parent != "" || c.etcd != "" || c.advertise != ""):
		return errors.New("serve: --parent, --etcd and --advertise need --resources")
	case c.parentCA != "" && c.parent == "":
		return errors.New("serve: --parent-tls-ca needs --parent")
	case c.etcd != "" && c.advertise == "":
		return errors.New("serve: --etcd needs --advertise (the address clients are redirected to)")
	case c.state != "" && (c.resources == "" || c.etcd != ""):
		return errors.New("serve: --capacity-state needs --resources and no --etcd (replicas learn on election)")
	case c.etcdTTL < 1:
		return fmt.Errorf("serve: --etcd-ttl %d: want 1 or more", c.etcdTTL)
	}
	return nil
}

// reloader is a service sharing the lease table that follows its reloads
// (RLQS).
type reloader interface {
	Reload(*lease.Config)
	Close()
}

// capacityService is the running lease service: the server, its parent
// loop, its election and the services sharing its table.
type capacityService struct {
	c       *capacityConfig
	srv     *capserver.Server
	log     *slog.Logger
	sum     [32]byte // the resources file's content as last loaded
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	elector *elect.Elector
	mu      sync.Mutex
	others  []reloader
}

// startCapacity opens the resources file and registers the Capacity
// service on gs (nil without --resources). The parent loop and the
// election start here; close stops them.
func (c *capacityConfig) start(gs *grpc.Server, metrics *service.Metrics, grpcAddr string, own *tls.Config, log *slog.Logger) (*capacityService, error) {
	if c.resources == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.resources)
	if err != nil {
		return nil, fmt.Errorf("--resources: %w", err)
	}
	cs := &capacityService{c: c, log: log, sum: sha256.Sum256(data)}
	srv, err := capserver.Open(c.resources, capserver.Options{Logger: log, Intermediate: c.parent != "", Replica: c.etcd != "",
		OnReload: cs.reloadOthers})
	if err != nil {
		return nil, err
	}
	cs.srv = srv
	if f := c.stateFile(); f != "" {
		if err := srv.PersistLeases(f); err != nil {
			return nil, fmt.Errorf("--capacity-state: %w", err)
		}
	}
	srv.Register(gs)
	if err := metrics.Register(srv.Collector()); err != nil {
		return nil, err
	}
	// Envoy's RLQS on the same table: it follows reloads and mastership.
	rlqs := capserver.RegisterRLQS(gs, srv, capserver.RLQSOptions{})
	cs.also(rlqs)
	if err := metrics.Register(rlqs.Collector()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs.cancel = cancel
	if c.parent != "" {
		id := c.id(grpcAddr)
		creds, err := c.parentCreds(own)
		if err != nil {
			cancel()
			return nil, err
		}
		dial := func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		}
		cs.wg.Go(func() {
			srv.RunParent(ctx, capserver.ParentOptions{Address: c.parent, ID: id, Dial: dial})
		})
		log.Info("capacity: intermediate server", "parent", c.parent, "server_id", id)
	}
	if c.etcd != "" {
		cs.elector, err = elect.Start(elect.Options{Endpoints: strings.Split(c.etcd, ","), Key: c.electionKey,
			Address: c.advertise, TTL: c.etcdTTL, OnChange: srv.SetMastership, Logger: log})
		if err != nil {
			cs.close()
			return nil, fmt.Errorf("--etcd: %w", err)
		}
	}
	log.Info("capacity leases served", "resources", c.resources, "replica", c.etcd != "")
	return cs, nil
}

// also adds a service sharing the table: it follows reloads and is closed
// with the lease service.
func (cs *capacityService) also(r reloader) {
	cs.mu.Lock()
	cs.others = append(cs.others, r)
	cs.mu.Unlock()
}

func (cs *capacityService) reloadOthers(cfg *lease.Config) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, r := range cs.others {
		r.Reload(cfg)
	}
}

func (c *capacityConfig) id(grpcAddr string) string {
	switch {
	case c.serverID != "":
		return c.serverID
	case c.advertise != "":
		return c.advertise
	}
	host, _ := os.Hostname()
	return host + "/" + grpcAddr
}

// parentCreds are the transport credentials towards the parent:
// plaintext, or with --parent-tls-ca TLS verified with that CA, presenting
// this server's own certificate (own, from --tls-cert) if it has one.
func (c *capacityConfig) parentCreds(own *tls.Config) (credentials.TransportCredentials, error) {
	if c.parentCA == "" {
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(c.parentCA)
	if err != nil {
		return nil, fmt.Errorf("--parent-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--parent-tls-ca %s: no certificates in it", c.parentCA)
	}
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if own != nil {
		conf.Certificates = own.Certificates
	}
	return credentials.NewTLS(conf), nil
}

// reload re-reads the resources file when its content has changed, or
// always when force is set (SIGHUP). A bad file is refused whole (logged
// with its file:line) and the resources live before stay live.
func (cs *capacityService) reload(force bool) {
	if cs == nil {
		return
	}
	data, err := os.ReadFile(cs.c.resources)
	if err != nil {
		cs.log.Error("resources reload refused; the previous resources stay live", "err", err)
		return
	}
	sum := sha256.Sum256(data)
	if !force && bytes.Equal(sum[:], cs.sum[:]) {
		return
	}
	cs.sum = sum
	cs.srv.Reload() // logs its error itself
}

// saveHorizon, once the gRPC server has stopped granting, lowers a single
// server's lease watermark to what its clients may still hold, so that a
// restart after a clean stop learns only while leases are out.
func (cs *capacityService) saveHorizon() {
	if cs == nil {
		return
	}
	if err := cs.srv.SaveHorizon(); err != nil {
		cs.log.Error("capacity: the lease horizon was not saved; a restart learns until the last watermark", "err", err)
	}
}

// close resigns mastership (another replica takes over at once) and stops
// the parent loop and the services sharing the table.
func (cs *capacityService) close() {
	if cs == nil {
		return
	}
	if cs.elector != nil {
		cs.elector.Close()
	}
	cs.cancel()
	cs.wg.Wait()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, r := range cs.others {
		r.Close()
	}
}
