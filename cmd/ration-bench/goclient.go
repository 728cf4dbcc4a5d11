package main

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ration-dev/ration/client"
)

// newGoClient is the Go client of -mode client: the decision deadline is
// -timeout, and -coalesce its CoalesceDelay.
func newGoClient(target string, cfg Config, creds credentials.TransportCredentials) (*client.Client, error) {
	c, err := client.New(target, client.Options{
		Timeout:          cfg.Timeout,
		CoalesceDelay:    cfg.Coalesce,
		CoalesceInFlight: cfg.CoalesceInFlight,
		DialOptions:      []grpc.DialOption{grpc.WithTransportCredentials(creds)},
	})
	if err != nil {
		return nil, fmt.Errorf("-target %s: %w", target, err)
	}
	return c, nil
}

// goClientCaller calls Client.Allow: what a Go service's goroutines do.
// Workers share the Client, so their calls coalesce as a service's would.
type goClientCaller struct {
	client *client.Client
	gen    *requestGen
}

func (c *goClientCaller) call(ctx context.Context, _ int, t tally) {
	r := c.gen.next()
	d, err := c.client.Allow(ctx, client.Request{
		Descriptors: r.GetDescriptors(),
		Rule:        r.GetRule(),
		Subject:     r.GetSubject(),
		Cost:        r.GetCost(),
		RequestID:   r.GetRequestId(),
	})
	switch {
	case errors.Is(err, client.ErrInvalid):
		t.add(kindError, "invalid", 1)
	case err != nil:
		t.add(kindError, "client:unavailable", 1)
	case d.Allowed:
		t.add(kindAllowed, string(d.Reason), 1)
	default:
		t.add(kindDenied, string(d.Reason), 1)
	}
}

func (c *goClientCaller) close() {}
