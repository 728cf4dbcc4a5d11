package agent_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/agent"
)

// FuzzDecodeAllow: any body either decodes or fails with ErrInvalidRequest;
// nothing panics.
func FuzzDecodeAllow(f *testing.F) {
	for _, s := range []string{
		`{"descriptors":{"tenant":"acme","endpoint":"search"}}`,
		`{"rule":"r","subject":"s","cost":2.5,"request_id":"id-1"}`,
		`{"descriptors":{}}`, `{"cost":0}`, `{"cost":-1e308}`, `{"cost":1e999}`, `[]`, `null`, `{`, ``,
		`{"descriptors":{"a":"b"}} {"x":1}`, `{"descriptors":{"a":1}}`, `{"unknown":true}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := agent.DecodeAllow(strings.NewReader(body))
		if err != nil {
			if !errors.Is(err, agent.ErrInvalidRequest) {
				t.Fatalf("DecodeAllow(%q) error %v does not wrap ErrInvalidRequest", body, err)
			}
			return
		}
		if req.Cost < 0 {
			t.Fatalf("DecodeAllow(%q) accepted negative cost %v", body, req.Cost)
		}
	})
}

// FuzzDecodeCheck: any query string either decodes or fails with
// ErrInvalidRequest; cost and request_id never leak into descriptors.
func FuzzDecodeCheck(f *testing.F) {
	for _, s := range []string{
		"tenant=acme&endpoint=search", "tenant=acme&cost=3", "cost=x", "cost=0", "a=1&a=2",
		"request_id=abc&user=u", "", "%zz", "cost=NaN", "cost=-Inf",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		req, err := agent.DecodeCheck(q)
		if err != nil {
			if !errors.Is(err, agent.ErrInvalidRequest) {
				t.Fatalf("DecodeCheck(%q) error %v does not wrap ErrInvalidRequest", raw, err)
			}
			return
		}
		if _, ok := req.Descriptors["cost"]; ok {
			t.Fatalf("DecodeCheck(%q): cost became a descriptor", raw)
		}
		if _, ok := req.Descriptors["request_id"]; ok {
			t.Fatalf("DecodeCheck(%q): request_id became a descriptor", raw)
		}
	})
}
