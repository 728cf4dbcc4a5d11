package agent_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// malformed is a request the HTTP API must refuse, whole, before any
// charge: the class of the flaw, the request ({u} stands for a subject of
// its own) and what the 400's message must name.
type malformed struct {
	class, input, field string
	// probe: descriptors whose bucket the request would charge if it were
	// decoded loosely (a replaced character, a dropped pair), besides
	// user={u} and tenant={u}, which every case probes.
	probe map[string]string
}

// malformedChecks are /v1/check queries that url.ParseQuery decodes only
// in part, or that say something other than what they would be taken for.
var malformedChecks = []malformed{
	{class: "bad escape in value", input: "user=%ZZ&tenant={u}", field: `"user"`},
	{class: "bad escape in value", input: "user={u}%ZZ&tenant={u}", field: `"user"`},
	{class: "bad escape in value, short", input: "tenant={u}&user={u}%2", field: `"user"`},
	{class: "bad escape in key", input: "us%ZZer={u}&tenant={u}", field: "pair 1"},
	{class: "bad escape in cost", input: "user={u}&cost=101%ZZ", field: `"cost"`},
	{class: "bad escape in request_id", input: "user={u}&request_id=r-%ZZ", field: `"request_id"`},
	{class: "semicolon in cost", input: "user={u}&cost=5;x", field: `"cost"`},
	{class: "semicolon as separator", input: "tenant={u}&user={u};x=1", field: `"user"`},
	{class: "semicolon in key", input: "tenant={u}&a;b=1", field: "pair 2"},
	{class: "invalid UTF-8 escaped in value", input: "user=%FF{u}&tenant={u}", field: `"user"`},
	{class: "invalid UTF-8 escaped in key", input: "%FF={u}&tenant={u}", field: "pair 1"},
	{class: "repeated descriptor", input: "user={u}&user={u}x&tenant={u}", field: `"user"`},
	{class: "repeated descriptor, one escaped", input: "user={u}&%75ser={u}&tenant={u}", field: `"user"`},
	{class: "repeated cost", input: "user={u}&cost=1&cost=5", field: `"cost"`},
	{class: "repeated request_id", input: "user={u}&request_id=a&request_id=b", field: `"request_id"`},
	{class: "case-folded key", input: "user={u}&COST=5", field: `"COST"`},
	{class: "case-folded key", input: "user={u}&Request_Id=r1", field: `"Request_Id"`},
	{class: "pair without =", input: "user={u}&tenant", field: `"tenant"`},
	{class: "empty key", input: "user={u}&=x", field: "pair 2"},
}

// malformedAllows are POST /v1/allow bodies that encoding/json decodes
// loosely: invalid UTF-8 replaced, duplicates last-wins, names case-folded,
// null taken as empty.
var malformedAllows = []malformed{
	{class: "invalid UTF-8 raw", input: `{"rule":"per-user","subject":"user={u}` + "\xff" + `"}`, field: `"subject"`,
		probe: map[string]string{"user": "{u}\uFFFD"}},
	{class: "invalid UTF-8 raw", input: `{"descriptors":{"user":"{u}` + "\xfe" + `"}}`, field: `descriptors["user"]`,
		probe: map[string]string{"user": "{u}\uFFFD"}},
	{class: "invalid UTF-8 raw in key", input: `{"descriptors":{"user` + "\xff" + `":"{u}","tenant":"{u}"}}`, field: `"descriptors": key`},
	{class: "invalid UTF-8 raw in request_id", input: `{"descriptors":{"user":"{u}"},"request_id":"r` + "\xc3" + `"}`, field: `"request_id"`},
	{class: "escaped lone surrogate", input: `{"descriptors":{"user":"{u}\ud800"}}`, field: `descriptors["user"]`,
		probe: map[string]string{"user": "{u}\uFFFD"}},
	{class: "escaped lone surrogate", input: `{"descriptors":{"user":"{u}\udc00"}}`, field: `descriptors["user"]`,
		probe: map[string]string{"user": "{u}\uFFFD"}},
	{class: "escaped lone surrogate", input: `{"descriptors":{"user":"{u}\ud800\u0041"}}`, field: `descriptors["user"]`,
		probe: map[string]string{"user": "{u}\uFFFDA"}},
	{class: "escaped lone surrogate in subject", input: `{"rule":"per-user","subject":"user={u}\uDBFF"}`, field: `"subject"`,
		probe: map[string]string{"user": "{u}\uFFFD"}},
	{class: "duplicate key", input: `{"descriptors":{"user":"{u}"},"cost":5,"cost":1}`, field: `"cost"`},
	{class: "duplicate key", input: `{"descriptors":{"user":"{u}"},"descriptors":{"tenant":"{u}"}}`, field: `"descriptors"`},
	{class: "duplicate key, one escaped", input: `{"descriptors":{"user":"{u}"},"c\u006fst":5,"cost":1}`, field: `"cost"`},
	{class: "duplicate descriptor", input: `{"descriptors":{"user":"x","user":"{u}"}}`, field: `"user"`},
	{class: "case-folded key", input: `{"descriptors":{"user":"{u}"},"COST":5}`, field: `"COST"`},
	{class: "case-folded key", input: `{"Descriptors":{"user":"{u}"}}`, field: `"Descriptors"`},
	{class: "case-folded key", input: `{"rule":"per-user","Subject":"user={u}"}`, field: `"Subject"`},
	{class: "null", input: `{"descriptors":{"user":null,"tenant":"{u}"}}`, field: `descriptors["user"]`},
	{class: "null", input: `{"descriptors":{"user":"{u}"},"cost":null}`, field: `"cost"`},
	{class: "null", input: `{"rule":"per-user","subject":null}`, field: `"subject"`},
	{class: "unknown field", input: `{"descriptors":{"user":"{u}"},"costs":5}`, field: `"costs"`},
	{class: "wrong type", input: `{"descriptors":{"user":"{u}"},"cost":"5"}`, field: `"cost"`},
	{class: "wrong type", input: `{"descriptors":{"user":5,"tenant":"{u}"}}`, field: `descriptors["user"]`},
}

const strictRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 5
    rate: 0
  - name: per-tenant
    match: {tenant: "*"}
    burst: 5
    rate: 0
`

// Every malformed query and body of the tables is refused by a real
// agent with 400 naming the field (or the pair's position), and charges
// nothing: afterwards each bucket it could have been taken for still
// admits its whole burst.
func TestMalformedHTTPChargesNothing(t *testing.T) {
	a := startAgent(t, strictRules)
	for i, tt := range malformedChecks {
		t.Run("check/"+tt.class, func(t *testing.T) {
			u := "c" + strconv.Itoa(i)
			code, msg := a.httpDo(t, "GET", "/v1/check?"+strings.ReplaceAll(tt.input, "{u}", u), "")
			if code != http.StatusBadRequest || !strings.Contains(msg, tt.field) {
				t.Errorf("GET /v1/check?%s = %d %q, want 400 naming %s", tt.input, code, msg, tt.field)
			}
			a.fullBurst(t, u, tt.probe)
		})
	}
	for i, tt := range malformedAllows {
		t.Run("allow/"+tt.class, func(t *testing.T) {
			u := "a" + strconv.Itoa(i)
			code, msg := a.httpDo(t, "POST", "/v1/allow", strings.ReplaceAll(tt.input, "{u}", u))
			var e struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(msg), &e); err == nil {
				msg = e.Error
			}
			if code != http.StatusBadRequest || !strings.Contains(msg, tt.field) {
				t.Errorf("POST /v1/allow %q = %d %q, want 400 naming %s", tt.input, code, msg, tt.field)
			}
			a.fullBurst(t, u, tt.probe)
		})
	}
}

// httpDo sends one request to the agent's HTTP API: its status and body.
func (a *testAgent) httpDo(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// fullBurst checks that user=u's, tenant=u's and probe's buckets (burst 5,
// rate 0) are untouched: each admits a cost of 5.
func (a *testAgent) fullBurst(t *testing.T, u string, probe map[string]string) {
	t.Helper()
	probes := []map[string]string{{"user": u}, {"tenant": u}}
	if probe != nil {
		p := map[string]string{}
		for k, v := range probe {
			p[k] = strings.ReplaceAll(v, "{u}", u)
		}
		probes = append(probes, p)
	}
	for _, d := range probes {
		body, err := json.Marshal(map[string]any{"descriptors": d, "cost": 5})
		if err != nil {
			t.Fatal(err)
		}
		code, msg := a.httpDo(t, "POST", "/v1/allow", string(body))
		var ans struct {
			Allowed bool `json:"allowed"`
		}
		if err := json.Unmarshal([]byte(msg), &ans); code != http.StatusOK || err != nil || !ans.Allowed {
			t.Errorf("after the refusal, %s = %d %s; want its whole burst (5) admitted: the refused request charged it", body, code, msg)
		}
	}
}
