package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
)

// capacityCheck is `floodgate check --capacity RESOURCE --wants N`: ask a
// capacity server for a lease and print it.
type capacityCheck struct {
	resource, clientID string
	wants              float64
	priority           int64
	release            bool
}

func (c *capacityCheck) register(fs *flag.FlagSet) {
	fs.StringVar(&c.resource, "capacity", "", "ask a capacity server for a lease on this resource (with --wants) instead of checking a descriptor")
	fs.Float64Var(&c.wants, "wants", 0, "--capacity: the capacity wanted")
	fs.Int64Var(&c.priority, "priority", 0, "--capacity: the priority band (higher is served first)")
	fs.StringVar(&c.clientID, "client-id", "", "--capacity: the client id (default: floodgate-check-HOST-PID)")
	fs.BoolVar(&c.release, "release", true, "--capacity: give the lease back after printing it (false: keep it until it expires)")
}

func (c *capacityCheck) check(domain string, descs, nargs int) error {
	switch {
	case domain != "" || descs > 0:
		return errors.New("--capacity does not take --domain or --descriptor")
	case nargs > 0:
		return errors.New("unexpected arguments")
	case math.IsNaN(c.wants) || math.IsInf(c.wants, 0) || c.wants < 0:
		return fmt.Errorf("--wants %v: want a finite number >= 0", c.wants)
	}
	if c.clientID == "" {
		host, _ := os.Hostname()
		c.clientID = "floodgate-check-" + host + "-" + strconv.Itoa(os.Getpid())
	}
	return nil
}

// run asks addr (following one master redirect) and prints the answer as
// JSON: 0 with a lease of capacity > 0, 3 with a lease of 0, 1 on an error.
func (c *capacityCheck) run(addr string, creds credentials.TransportCredentials, timeout time.Duration, stdout, stderr io.Writer) int {
	req := &pb.GetCapacityRequest{ClientId: c.clientID,
		Resource: []*pb.ResourceRequest{{ResourceId: c.resource, Wants: c.wants, Priority: c.priority}}}
	for hop := 0; ; hop++ {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer conn.Close()
		cl := pb.NewCapacityClient(conn)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		resp, err := cl.GetCapacity(ctx, req)
		if err != nil {
			fmt.Fprintln(stderr, "GetCapacity:", err)
			return 1
		}
		if m := resp.Mastership; m != nil {
			if m.MasterAddress == "" || hop > 0 {
				fmt.Fprintf(stderr, "%s is not the master and names %q\n", addr, m.MasterAddress)
				return 1
			}
			fmt.Fprintf(stderr, "redirected to the master, %s\n", m.MasterAddress)
			addr = m.MasterAddress
			continue
		}
		out, _ := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(resp)
		fmt.Fprintln(stdout, string(out))
		if c.release {
			if _, err := cl.ReleaseCapacity(ctx, &pb.ReleaseCapacityRequest{ClientId: c.clientID, ResourceId: []string{c.resource}}); err != nil {
				fmt.Fprintln(stderr, "ReleaseCapacity:", err)
			}
		}
		if len(resp.Response) == 0 || resp.Response[0].GetGets().GetCapacity() == 0 {
			return 3
		}
		return 0
	}
}
