package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/ration-dev/ration/client"
)

func ExampleClient_Allow() {
	// agentAddr is the agent's -grpc address, e.g. "127.0.0.1:8081".
	c, err := client.New(agentAddr, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	req := client.Request{Descriptors: map[string]string{"tenant": "globex", "endpoint": "search"}}
	for i := 0; i < 3; i++ {
		d, err := c.Allow(context.Background(), req)
		if err != nil {
			log.Fatal(err) // wraps client.ErrUnavailable or client.ErrInvalid
		}
		fmt.Println(d.Allowed, d.Reason, d.Rule, d.Remaining, d.Status())
	}
	// Output:
	// true ok tenant-search 1 200
	// true ok tenant-search 0 200
	// false over_limit tenant-search 0 429
}

func ExampleMiddleware() {
	c, err := client.New(agentAddr, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Limit /search per tenant; everything else passes unchecked.
	limit := client.Middleware(c, func(r *http.Request) (client.Request, bool) {
		if r.URL.Path != "/search" {
			return client.Request{}, false
		}
		return client.Request{Descriptors: map[string]string{
			"tenant":   r.Header.Get("X-Tenant"),
			"endpoint": "search",
		}}, true
	}, client.MiddlewareOptions{})

	search := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "results")
	})
	srv := httptest.NewServer(limit(search))
	defer srv.Close()

	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/search", nil)
		req.Header.Set("X-Tenant", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"), "Retry-After set:", resp.Header.Get("Retry-After") != "")
	}
	// Output:
	// 200 "tenant-search";q=2;w=7200 Retry-After set: false
	// 200 "tenant-search";q=2;w=7200 Retry-After set: false
	// 429 "tenant-search";q=2;w=7200 Retry-After set: true
}
