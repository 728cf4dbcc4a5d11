package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ration-dev/ration/internal/agent"
)

// FuzzDecodeAllow: any body either fails with ErrInvalidRequest, or
// decodes to exactly what it says: encoding/json reads the same fields
// and values from it (so nothing was dropped, replaced or case-folded),
// each object's keys are distinct, no value is null, and the request
// re-encoded decodes to itself.
func FuzzDecodeAllow(f *testing.F) {
	for _, s := range []string{
		`{"descriptors":{"tenant":"acme","endpoint":"search"}}`,
		`{"rule":"r","subject":"s","cost":2.5,"request_id":"id-1"}`,
		`{"descriptors":{}}`, `{"cost":0}`, `{"cost":-1e308}`, `{"cost":1e999}`, `[]`, `null`, `{`, ``,
		`{"descriptors":{"a":"b"}} {"x":1}`, `{"descriptors":{"a":1}}`, `{"unknown":true}`,
		`{"descriptors":{"user":"\ud83d\ude00 \u00e9 \ufffd"}}`, "{\"descriptors\":{\"user\":\"\xef\xbf\xbd\"}}",
	} {
		f.Add(s)
	}
	for _, m := range malformedAllows {
		f.Add(strings.ReplaceAll(m.input, "{u}", "s"))
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := agent.DecodeAllow(strings.NewReader(body))
		if err != nil {
			if !errors.Is(err, agent.ErrInvalidRequest) {
				t.Fatalf("DecodeAllow(%q) error %v does not wrap ErrInvalidRequest", body, err)
			}
			return
		}
		var std map[string]any
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&std); err != nil || std == nil {
			t.Fatalf("DecodeAllow(%q) accepted what encoding/json refuses: %v", body, err)
		}
		if err := distinctKeys(body); err != nil {
			t.Fatalf("DecodeAllow(%q) accepted it: %v", body, err)
		}
		if want := fromStd(t, body, std); !reflect.DeepEqual(req, want) {
			t.Fatalf("DecodeAllow(%q) = %+v, encoding/json reads %+v", body, req, want)
		}
		noReplacement(t, body, req)
		again, err := json.Marshal(toJSON(req))
		if err != nil {
			t.Fatal(err)
		}
		back, err := agent.DecodeAllow(bytes.NewReader(again))
		if err != nil || !reflect.DeepEqual(back, req) {
			t.Fatalf("DecodeAllow(%q) = %+v; re-encoded as %s it decodes to %+v, %v", body, req, again, back, err)
		}
	})
}

// fromStd is the request encoding/json's reading of body says, failing
// on what a strict reading must not accept: an unknown (or case-folded)
// field, a null, a value of another type.
func fromStd(t *testing.T, body string, std map[string]any) agent.Request {
	t.Helper()
	var want agent.Request
	for k, v := range std {
		var ok bool
		switch k {
		case "descriptors":
			var d map[string]any
			if d, ok = v.(map[string]any); v == nil {
				ok = true // "descriptors": null is the field left out
			} else if ok {
				want.Descriptors = map[string]string{}
				for dk, dv := range d {
					s, isStr := dv.(string)
					ok = ok && isStr
					want.Descriptors[dk] = s
				}
			}
		case "rule":
			want.Rule, ok = v.(string)
		case "subject":
			want.Subject, ok = v.(string)
		case "request_id":
			want.RequestID, ok = v.(string)
		case "cost":
			var n json.Number
			if n, ok = v.(json.Number); ok {
				c, err := strconv.ParseFloat(string(n), 64)
				ok = err == nil && c > 0
				want.Cost = c
			}
		}
		if !ok {
			t.Fatalf("DecodeAllow(%q) accepted field %q = %#v", body, k, v)
		}
	}
	return want
}

// distinctKeys walks body's tokens: every object's keys must be distinct.
func distinctKeys(body string) error {
	dec := json.NewDecoder(strings.NewReader(body))
	var stack []map[string]bool // one per open object; nil for an array
	wantKey := func() bool { return len(stack) > 0 && stack[len(stack)-1] != nil }
	key := true // whether the next string in an object is a key
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		switch tok {
		case json.Delim('{'):
			stack, key = append(stack, map[string]bool{}), true
			continue
		case json.Delim('['):
			stack = append(stack, nil)
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		default:
			if s, ok := tok.(string); ok && wantKey() && key {
				if stack[len(stack)-1][s] {
					return errors.New("key " + strconv.Quote(s) + " repeated")
				}
				stack[len(stack)-1][s], key = true, false
				continue
			}
		}
		key = true
	}
}

// noReplacement: a U+FFFD in what was decoded must have been sent as one
// (raw or escaped), not made from bytes that are not UTF-8 or from a lone
// surrogate escape.
func noReplacement(t *testing.T, body string, req agent.Request) {
	t.Helper()
	strs := []string{req.Rule, req.Subject, req.RequestID}
	for k, v := range req.Descriptors {
		strs = append(strs, k, v)
	}
	sent := strings.Count(body, "\uFFFD") + strings.Count(strings.ToLower(body), `\ufffd`)
	got := 0
	for _, s := range strs {
		got += strings.Count(s, "\uFFFD")
	}
	if got > sent || !utf8.ValidString(body) {
		t.Fatalf("DecodeAllow(%q) = %+v: %d U+FFFD decoded, %d sent", body, req, got, sent)
	}
}

// toJSON is req as a /v1/allow body.
func toJSON(req agent.Request) map[string]any {
	m := map[string]any{}
	if req.Descriptors != nil {
		m["descriptors"] = req.Descriptors
	}
	for k, v := range map[string]string{"rule": req.Rule, "subject": req.Subject, "request_id": req.RequestID} {
		if v != "" {
			m[k] = v
		}
	}
	if req.Cost != 0 {
		m["cost"] = req.Cost
	}
	return m
}

// FuzzDecodeCheck: any raw query either fails with ErrInvalidRequest, or
// decodes to exactly what it says: url.ParseQuery reads it without error
// and to the same pairs, each key once (so no pair was dropped or
// merged), cost and request_id never become descriptors, and the request
// re-encoded decodes to itself.
func FuzzDecodeCheck(f *testing.F) {
	for _, s := range []string{
		"tenant=acme&endpoint=search", "tenant=acme&cost=3", "cost=x", "cost=0", "a=1&a=2",
		"request_id=abc&user=u", "", "%zz", "cost=NaN", "cost=-Inf", "a=1&&b=2&", "a+b=c%20d%2B",
	} {
		f.Add(s)
	}
	for _, m := range malformedChecks {
		f.Add(strings.ReplaceAll(m.input, "{u}", "s"))
	}
	f.Fuzz(func(t *testing.T, raw string) {
		req, err := agent.DecodeCheck(raw)
		if err != nil {
			if !errors.Is(err, agent.ErrInvalidRequest) {
				t.Fatalf("DecodeCheck(%q) error %v does not wrap ErrInvalidRequest", raw, err)
			}
			return
		}
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatalf("DecodeCheck(%q) = %+v, but url.ParseQuery drops part of it: %v", raw, req, err)
		}
		want := agent.Request{Descriptors: map[string]string{}}
		for k, vs := range q {
			if len(vs) != 1 {
				t.Fatalf("DecodeCheck(%q) accepted %q given %d times", raw, k, len(vs))
			}
			switch k {
			case "cost":
				c, err := strconv.ParseFloat(vs[0], 64)
				if err != nil || c == 0 || math.IsNaN(c) || math.IsInf(c, 0) {
					t.Fatalf("DecodeCheck(%q) accepted cost %q", raw, vs[0])
				}
				want.Cost = c
			case "request_id":
				want.RequestID = vs[0]
			default:
				want.Descriptors[k] = vs[0]
			}
		}
		if !reflect.DeepEqual(req, want) {
			t.Fatalf("DecodeCheck(%q) = %+v, url.ParseQuery reads %+v", raw, req, want)
		}
		vals := url.Values{}
		for k, v := range maps.All(req.Descriptors) {
			vals.Set(k, v)
		}
		if req.Cost != 0 {
			vals.Set("cost", strconv.FormatFloat(req.Cost, 'g', -1, 64))
		}
		if req.RequestID != "" {
			vals.Set("request_id", req.RequestID)
		}
		back, err := agent.DecodeCheck(vals.Encode())
		if err != nil || !reflect.DeepEqual(back, req) {
			t.Fatalf("DecodeCheck(%q) = %+v; re-encoded as %q it decodes to %+v, %v", raw, req, vals.Encode(), back, err)
		}
	})
}

// What is exact is read, however it is written: escapes, surrogate pairs,
// U+FFFD sent as such, whitespace, "+" for a space, empty pairs, null
// descriptors. (The fuzz targets hold what is accepted to be exact; this
// holds the strict decoders to accepting it.)
func TestStrictDecodersAcceptExactInput(t *testing.T) {
	allows := []struct {
		body string
		want agent.Request
	}{
		{`{"descriptors":{"user":"\ud83d\ude00 \u00e9 \ufffd \\ud800 \"q\""}}`,
			agent.Request{Descriptors: map[string]string{"user": "\U0001F600 é \uFFFD \\ud800 \"q\""}}},
		{"{\"descriptors\":{\"user\":\"\xef\xbf\xbd\xf0\x9f\x98\x80\"}}",
			agent.Request{Descriptors: map[string]string{"user": "\uFFFD\U0001F600"}}},
		{" {\n\t\"rule\" : \"per-user\" ,\r\n \"subject\":\"user=a\", \"cost\": 2.5e0, \"request_id\" :\"r-1\"} \n",
			agent.Request{Rule: "per-user", Subject: "user=a", Cost: 2.5, RequestID: "r-1"}},
		{`{"descriptors":null,"rule":"r","subject":"s"}`, agent.Request{Rule: "r", Subject: "s"}},
		{`{"descriptors":{"c\u006fst":"x","Cost":"y"}}`, agent.Request{Descriptors: map[string]string{"cost": "x", "Cost": "y"}}},
	}
	for _, tt := range allows {
		got, err := agent.DecodeAllow(strings.NewReader(tt.body))
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("DecodeAllow(%q) = %+v, %v; want %+v", tt.body, got, err, tt.want)
		}
	}
	checks := []struct {
		query string
		want  agent.Request
	}{
		{"a+b=c%20d%2B&%3B=%26&e=", agent.Request{Descriptors: map[string]string{"a b": "c d+", ";": "&", "e": ""}}},
		{"&user=a&&cost=2.5&request_id=r-1&", agent.Request{Descriptors: map[string]string{"user": "a"}, Cost: 2.5, RequestID: "r-1"}},
		{"user=%C3%A9%F0%9F%98%80", agent.Request{Descriptors: map[string]string{"user": "é\U0001F600"}}},
	}
	for _, tt := range checks {
		got, err := agent.DecodeCheck(tt.query)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("DecodeCheck(%q) = %+v, %v; want %+v", tt.query, got, err, tt.want)
		}
	}
}
