package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/ration-dev/ration/client"
)

// One Client per agent, shared; a Middleware per route family.
func Example() {
	// The agent's -grpc address (a sidecar on loopback).
	c, err := client.New("127.0.0.1:8081", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	limit := client.Middleware(c, func(r *http.Request) (client.Request, bool) {
		if r.URL.Path == "/healthz" {
			return client.Request{}, false // not checked
		}
		return client.Request{Descriptors: map[string]string{
			"tenant":   r.Header.Get("X-Tenant"),
			"endpoint": "search",
		}}, true
	}, client.MiddlewareOptions{})

	mux := http.NewServeMux()
	mux.HandleFunc("/search", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "results")
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:9000", limit(mux)))
}

func ExampleClient_Allow() {
	c, err := client.New("127.0.0.1:8081", client.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	d, err := c.Allow(context.Background(), client.Request{
		Descriptors: map[string]string{"tenant": "acme", "endpoint": "search"},
	})
	switch {
	case errors.Is(err, client.ErrUnavailable):
		fmt.Println("no decision: the agent is unreachable or too slow; apply your own policy")
	case errors.Is(err, client.ErrInvalid):
		fmt.Println("never succeeds as sent; nothing was charged:", err)
	case err != nil:
		fmt.Println(err) // the caller's context was canceled
	case !d.Allowed:
		fmt.Println(d.Status(), "retry after", d.RetryAfter) // 429, or 503 when the rule fails closed
	default:
		fmt.Println("admitted by", d.Rule, "with", d.Remaining, "left")
	}
}

// Many independent requests in one call: one message each way, one store
// round trip. Options.BatchTimeout bounds the call, apart from the
// Timeout of single decisions.
func ExampleClient_AllowBatch() {
	c, err := client.New("127.0.0.1:8081", client.Options{BatchTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	users := []string{"alice", "bob", "carol"}
	reqs := make([]client.Request, len(users))
	for i, u := range users {
		reqs[i] = client.Request{Rule: "per-user", Subject: u}
	}
	ds, err := c.AllowBatch(context.Background(), reqs)
	if err != nil {
		log.Fatal(err) // the whole call failed: ErrUnavailable
	}
	for i, d := range ds {
		if d.Err != nil { // this item was malformed: ErrInvalid
			fmt.Println(users[i], d.Err)
			continue
		}
		fmt.Println(users[i], d.Allowed)
	}
}

// A long-lived stream for a hot path: one HTTP/2 stream carries every
// decision. Stream is an Allower, so Middleware takes it too.
func ExampleClient_AllowStream() {
	c, err := client.New("127.0.0.1:8081", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The stream lives as long as this context (or until Close), not as
	// long as one request.
	s := c.AllowStream(context.Background())
	defer s.Close()

	for _, u := range []string{"alice", "alice", "bob"} {
		d, err := s.Allow(context.Background(), client.Request{Rule: "per-user", Subject: u})
		if err != nil {
			fmt.Println(u, err) // ErrUnavailable: the next call opens a new stream
			continue
		}
		fmt.Println(u, d.Allowed, d.Remaining)
	}
}

func ExampleMiddleware() {
	c, err := client.New("127.0.0.1:8081", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	limit := client.Middleware(c, func(r *http.Request) (client.Request, bool) {
		return client.Request{Descriptors: map[string]string{
			"user":  r.Header.Get("X-User-Id"), // better: the authenticated id
			"route": "orders",                  // a bounded name, not the raw path
		}}, true
	}, client.MiddlewareOptions{
		// Let requests through when the agent itself cannot be reached
		// (its rules' on_failure decide when its store is down).
		FailOpen: true,
		OnError:  func(r *http.Request, err error) { log.Printf("rate limit check: %v", err) },
	})
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	http.Handle("/orders", limit(orders))
}
