package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/internal/lease"
)

// Refusal reasons, the refusals metric's reason label.
const (
	ReasonNotMaster      = "not_master"       // a replica that is not the master
	ReasonInvalid        = "invalid_argument" // bad input
	ReasonTooManyClients = "too_many_clients" // the table's client bound
	ReasonError          = "error"            // the table refused otherwise
)

// notMaster returns the redirect a non-master answers with, or nil on the
// master.
func (s *Server) notMaster() *pb.Mastership {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.isMaster {
		return nil
	}
	return &pb.Mastership{MasterAddress: s.master}
}

// Discovery says which server is the master.
func (s *Server) Discovery(ctx context.Context, req *pb.DiscoveryRequest) (*pb.DiscoveryResponse, error) {
	isMaster, master := s.Mastership()
	return &pb.DiscoveryResponse{IsMaster: isMaster, Mastership: &pb.Mastership{MasterAddress: master}}, nil
}

// GetCapacity grants the client a lease per resource it asks for.
func (s *Server) GetCapacity(ctx context.Context, req *pb.GetCapacityRequest) (*pb.GetCapacityResponse, error) {
	if err := s.validateGet(req); err != nil {
		s.metrics.refuse("", ReasonInvalid)
		return nil, err
	}
	if m := s.notMaster(); m != nil {
		s.metrics.refuse("", ReasonNotMaster)
		return &pb.GetCapacityResponse{Mastership: m}, nil
	}
	reqs := make([]lease.Request, len(req.Resource))
	for i, r := range req.Resource {
		reqs[i] = lease.Request{Resource: r.ResourceId, Priority: r.Priority, Wants: r.Wants, Has: fromPB(r.Has)}
	}
	got, err := s.table.Get(req.ClientId, reqs, make([]lease.Lease, 0, len(reqs)))
	if err != nil {
		return nil, s.tableError(err, req.Resource[0].ResourceId)
	}
	resp := &pb.GetCapacityResponse{Response: make([]*pb.ResourceResponse, len(got))}
	for i, l := range got {
		resp.Response[i] = &pb.ResourceResponse{ResourceId: req.Resource[i].ResourceId, Gets: toPB(l)}
	}
	return resp, nil
}

// ReleaseCapacity drops the client's leases on the resources named.
func (s *Server) ReleaseCapacity(ctx context.Context, req *pb.ReleaseCapacityRequest) (*pb.ReleaseCapacityResponse, error) {
	if err := s.validateRelease(req); err != nil {
		s.metrics.refuse("", ReasonInvalid)
		return nil, err
	}
	if m := s.notMaster(); m != nil {
		s.metrics.refuse("", ReasonNotMaster)
		return &pb.ReleaseCapacityResponse{Mastership: m}, nil
	}
	s.table.Release(req.ClientId, req.ResourceId)
	return &pb.ReleaseCapacityResponse{}, nil
}

// GetServerCapacity grants a child server a lease per resource: the child
// is one client of the resource whose wants are its clients' aggregate,
// band by band (each band weighing as many clients as it counts).
func (s *Server) GetServerCapacity(ctx context.Context, req *pb.GetServerCapacityRequest) (*pb.GetServerCapacityResponse, error) {
	if err := s.validateServer(req); err != nil {
		s.metrics.refuse("", ReasonInvalid)
		return nil, err
	}
	if m := s.notMaster(); m != nil {
		s.metrics.refuse("", ReasonNotMaster)
		return &pb.GetServerCapacityResponse{Mastership: m}, nil
	}
	ds := make([]lease.Demand, len(req.Resource))
	for i, r := range req.Resource {
		d := lease.Demand{Resource: r.ResourceId, Has: fromPB(r.Has), Bands: make([]lease.Band, len(r.Wants))}
		for j, b := range r.Wants {
			d.Bands[j] = lease.Band{Priority: b.Priority, Clients: b.NumClients, Wants: b.Wants}
		}
		ds[i] = d
	}
	got, err := s.table.GetServer(req.ServerId, ds, make([]lease.Lease, 0, len(ds)))
	if err != nil {
		return nil, s.tableError(err, req.Resource[0].ResourceId)
	}
	resp := &pb.GetServerCapacityResponse{Response: make([]*pb.ServerCapacityResourceResponse, len(got))}
	for i, l := range got {
		resp.Response[i] = &pb.ServerCapacityResourceResponse{ResourceId: req.Resource[i].ResourceId, Gets: toPB(l)}
	}
	return resp, nil
}

// tableError maps the table's refusal to a gRPC status and counts it
// (under the configuration entry of the call's first resource: a label
// bounded by the configuration, not by what clients send).
func (s *Server) tableError(err error, resource string) error {
	entry := ""
	if r := s.Config().Find(resource); r != nil {
		entry = r.ID
	}
	if errors.Is(err, lease.ErrTooManyClients) {
		s.metrics.refuse(entry, ReasonTooManyClients)
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	s.metrics.refuse(entry, ReasonError)
	return status.Error(codes.InvalidArgument, err.Error())
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// idProblem is what is wrong with an id, "" if nothing (no allocation
// on the happy path: field names are formatted only for an error).
func idProblem(id string) string {
	switch {
	case id == "":
		return "empty"
	case len(id) > MaxIDLength:
		return fmt.Sprintf("%d bytes, at most %d", len(id), MaxIDLength)
	case !utf8.ValidString(id):
		return "not valid UTF-8"
	}
	return ""
}

func checkID(field, id string) error {
	if p := idProblem(id); p != "" {
		return invalid("%s: %s", field, p)
	}
	return nil
}

// amountOK accepts a finite amount ≥ 0.
func amountOK(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }

// checkAmount accepts a finite amount ≥ 0.
func checkAmount(field string, v float64) error {
	if !amountOK(v) {
		return invalid("%s: %v, want a finite number >= 0", field, v)
	}
	return nil
}

func (s *Server) checkCount(n int) error {
	if n == 0 {
		return invalid("resource: none asked for")
	}
	if n > s.opts.MaxResources {
		return invalid("resource: %d in one call, at most %d", n, s.opts.MaxResources)
	}
	return nil
}

func checkLease(field string, l *pb.Lease) error {
	if l == nil {
		return nil
	}
	if !amountOK(l.Capacity) {
		return checkAmount(field+".capacity", l.Capacity)
	}
	if l.Expiry != nil && l.Expiry.CheckValid() != nil {
		return invalid("%s.expiry: %v", field, l.Expiry.CheckValid())
	}
	return nil
}

// leaseOK is checkLease without the error (the happy path's).
func leaseOK(l *pb.Lease) bool {
	return l == nil || amountOK(l.Capacity) && (l.Expiry == nil || l.Expiry.IsValid())
}

// dupID returns the index of an earlier resource with the id of
// resource i (-1 if none): a scan for the few resources of a usual call,
// a map beyond.
func dupID(ids func(int) string, seen map[string]int, i int) int {
	id := ids(i)
	if seen == nil {
		for j := range i {
			if ids(j) == id {
				return j
			}
		}
		return -1
	}
	if j, ok := seen[id]; ok {
		return j
	}
	seen[id] = i
	return -1
}

// scanLimit is the most resources in a call checked for duplicates by a
// scan rather than a map.
const scanLimit = 8

func (s *Server) validateGet(req *pb.GetCapacityRequest) error {
	if err := checkID("client_id", req.ClientId); err != nil {
		return err
	}
	if err := s.checkCount(len(req.Resource)); err != nil {
		return err
	}
	var seen map[string]int
	if len(req.Resource) > scanLimit {
		seen = make(map[string]int, len(req.Resource))
	}
	ids := func(i int) string { return req.Resource[i].ResourceId }
	for i, r := range req.Resource {
		if p := idProblem(r.ResourceId); p != "" {
			return invalid("resource[%d].resource_id: %s", i, p)
		}
		if dupID(ids, seen, i) >= 0 {
			return invalid("resource[%d].resource_id: %q named twice in one call", i, r.ResourceId)
		}
		if !amountOK(r.Wants) {
			return checkAmount(fmt.Sprintf("resource[%d].wants", i), r.Wants)
		}
		if !leaseOK(r.Has) {
			return checkLease(fmt.Sprintf("resource[%d].has", i), r.Has)
		}
	}
	return nil
}

func (s *Server) validateRelease(req *pb.ReleaseCapacityRequest) error {
	if err := checkID("client_id", req.ClientId); err != nil {
		return err
	}
	if err := s.checkCount(len(req.ResourceId)); err != nil {
		return err
	}
	for i, id := range req.ResourceId {
		if err := checkID(fmt.Sprintf("resource_id[%d]", i), id); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) validateServer(req *pb.GetServerCapacityRequest) error {
	if err := checkID("server_id", req.ServerId); err != nil {
		return err
	}
	if err := s.checkCount(len(req.Resource)); err != nil {
		return err
	}
	seen := make(map[string]bool, len(req.Resource))
	for i, r := range req.Resource {
		f := fmt.Sprintf("resource[%d]", i)
		if err := checkID(f+".resource_id", r.ResourceId); err != nil {
			return err
		}
		if seen[r.ResourceId] {
			return invalid("%s.resource_id: %q named twice in one call", f, r.ResourceId)
		}
		seen[r.ResourceId] = true
		if err := checkLease(f+".has", r.Has); err != nil {
			return err
		}
		if len(r.Wants) > 64 {
			return invalid("%s.wants: %d priority bands, at most 64", f, len(r.Wants))
		}
		for j, b := range r.Wants {
			g := fmt.Sprintf("%s.wants[%d]", f, j)
			if err := checkAmount(g+".wants", b.Wants); err != nil {
				return err
			}
			if b.NumClients < 0 {
				return invalid("%s.num_clients: %d, want >= 0", g, b.NumClients)
			}
		}
	}
	return nil
}

// fromPB converts a wire lease (nil: none) to the table's.
func fromPB(l *pb.Lease) lease.Lease {
	if l == nil {
		return lease.Lease{}
	}
	out := lease.Lease{Capacity: l.Capacity, Safe: l.SafeCapacity}
	if l.Expiry != nil {
		out.Expiry = l.Expiry.AsTime()
	}
	if l.RefreshInterval != nil {
		out.Refresh = l.RefreshInterval.AsDuration()
	}
	return out
}

// toPB converts the table's lease to the wire's.
func toPB(l lease.Lease) *pb.Lease {
	out := &pb.Lease{Capacity: l.Capacity, SafeCapacity: l.Safe, RefreshInterval: durationpb.New(l.Refresh)}
	if !l.Expiry.IsZero() {
		out.Expiry = timestamppb.New(l.Expiry)
	}
	return out
}
