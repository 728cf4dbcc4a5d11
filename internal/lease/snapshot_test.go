package lease

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// busyState applies a little of everything, leaving leases, a pending
// shrink, recorded answers with item errors, and two quotas.
func busyState(t *testing.T) *State {
	t.Helper()
	s := New()
	for i, c := range []Command{
		quotaQ(0),
		ConfigureQuota{Quota: "z", Burst: 5, Rate: 0, LeasePeriod: 3 * sec},
		Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100},
		Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 100, Weight: 2},
		Grant{Holder: "b", Seq: 2, Quota: "z", Demand: 1},
		Renew{Now: sec, Holder: "a", Seq: 2, Items: []RenewItem{
			{LeaseID: 1, Quota: "q", Demand: 100, ConfirmedCap: 100, ConfirmedRate: 10},
			{LeaseID: 77, Quota: "q"},
		}},
		Release{Now: sec, Holder: "c", Seq: 4, LeaseID: 3},
		Tick{Now: 2 * sec},
	} {
		if _, err := s.Apply(c); err != nil && !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("command %d %+v: %v", i, c, err)
		}
	}
	return s
}

func TestMarshalRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		state func(t *testing.T) *State
	}{
		{"empty", func(*testing.T) *State { return New() }},
		{"busy", busyState},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.state(t)
			b, err := s.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			again, _ := s.MarshalBinary()
			if !bytes.Equal(b, again) {
				t.Fatalf("MarshalBinary is not deterministic:\n%s\n%s", b, again)
			}
			u := New()
			if err := u.UnmarshalBinary(b); err != nil {
				t.Fatalf("UnmarshalBinary: %v", err)
			}
			ub, _ := u.MarshalBinary()
			if !bytes.Equal(b, ub) {
				t.Fatalf("round trip differs:\n%s\n%s", b, ub)
			}
			// Both continue identically, replays included.
			next := []Command{
				Renew{Now: 3 * sec, Holder: "a", Seq: 2, Items: []RenewItem{{LeaseID: 1, Quota: "q"}}},
				Renew{Now: 3 * sec, Holder: "a", Seq: 3, Items: []RenewItem{{LeaseID: 1, Quota: "q", Unused: 50, Demand: 1, ConfirmedCap: 50, ConfirmedRate: 5}}},
				Tick{Now: 20 * sec},
			}
			for _, c := range next {
				r1, e1 := s.Apply(c)
				r2, e2 := u.Apply(c)
				if errString(e1) != errString(e2) || !sameResult(r1, r2) {
					t.Fatalf("after round trip, %+v answers %+v, %v; original %+v, %v", c, r2, e2, r1, e1)
				}
			}
			sb, _ := s.MarshalBinary()
			ub, _ = u.MarshalBinary()
			if !bytes.Equal(sb, ub) {
				t.Fatalf("states diverged after the round trip:\n%s\n%s", sb, ub)
			}
		})
	}
}

func TestUnmarshalRejectsCorrupt(t *testing.T) {
	good, err := busyState(t).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	edit := func(old, new string) []byte {
		t.Helper()
		if !bytes.Contains(good, []byte(old)) {
			t.Fatalf("snapshot has no %q: %s", old, good)
		}
		return bytes.Replace(good, []byte(old), []byte(new), 1)
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"garbage", []byte("not json")},
		{"empty", nil},
		{"version", edit(`"version":1`, `"version":2`)},
		{"unknown field", edit(`"version":1`, `"version":1,"extra":0`)},
		{"trailing", append(append([]byte{}, good...), "{}"...)},
		{"pool above its room", edit(`"pool":0`, `"pool":1`)},
		{"negative pool", edit(`"pool":0`, `"pool":-1`)},
		{"reserved below current size", edit(`"res_cap":100`, `"res_cap":1`)},
		{"lease of an unknown holder", edit(`"holder":"b"`, `"holder":"nobody"`)},
		{"quota repeated", edit(`"name":"z"`, `"name":"q"`)},
		{"lease id not below next id", edit(`"next_id":4`, `"next_id":2`)},
		{"bad config", edit(`"lease_period":10000000`, `"lease_period":0`)},
		{"bad answer code", edit(`"code":1`, `"code":9`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := busyState(t)
			before, _ := s.MarshalBinary()
			if err := s.UnmarshalBinary(tt.in); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("UnmarshalBinary(%s) = %v, want ErrCorrupt", tt.in, err)
			}
			after, _ := s.MarshalBinary()
			if !bytes.Equal(before, after) {
				t.Fatalf("failed UnmarshalBinary changed the state")
			}
		})
	}
}

func TestClone(t *testing.T) {
	s := busyState(t)
	before, _ := s.MarshalBinary()
	c := s.Clone()
	cb, _ := c.MarshalBinary()
	if !bytes.Equal(before, cb) {
		t.Fatalf("clone differs:\n%s\n%s", before, cb)
	}
	for _, cmd := range []Command{
		Renew{Now: 3 * sec, Holder: "a", Seq: 3, Items: []RenewItem{{LeaseID: 1, Quota: "q", Unused: 50, Demand: 1, ConfirmedCap: 50, ConfirmedRate: 5}}},
		Grant{Now: 3 * sec, Holder: "d", Seq: 1, Quota: "q", Demand: 3},
		ConfigureQuota{Now: 4 * sec, Quota: "q", Burst: 1, Rate: 1, LeasePeriod: sec},
		Tick{Now: 60 * sec},
	} {
		if _, err := c.Apply(cmd); err != nil {
			t.Fatalf("clone Apply(%+v): %v", cmd, err)
		}
	}
	// Answers handed out must not alias recorded ones either.
	r, _ := c.Apply(Renew{Now: 3 * sec, Holder: "a", Seq: 3, Items: []RenewItem{{LeaseID: 1, Quota: "q"}}})
	if len(r.Items) == 1 && r.Items[0].Lease != nil {
		r.Items[0].Lease.Cap = 1e9
	}
	after, _ := s.MarshalBinary()
	if !bytes.Equal(before, after) {
		t.Fatalf("changing the clone changed the original:\n%s\n%s", before, after)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	cb2, _ := c.MarshalBinary()
	if strings.Contains(string(cb2), "1e+09") {
		t.Fatalf("a returned answer aliases the recorded one: %s", cb2)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sameResult compares answers, errors by message.
func sameResult(a, b Result) bool {
	if a.Credited != b.Credited || a.Replayed != b.Replayed || !equalPtr(a.Lease, b.Lease) ||
		len(a.Items) != len(b.Items) || len(a.Reclaimed) != len(b.Reclaimed) {
		return false
	}
	for i := range a.Items {
		x, y := a.Items[i], b.Items[i]
		if x.LeaseID != y.LeaseID || x.Quota != y.Quota || x.Credited != y.Credited ||
			!equalPtr(x.Lease, y.Lease) || errString(x.Err) != errString(y.Err) {
			return false
		}
	}
	for i := range a.Reclaimed {
		if a.Reclaimed[i] != b.Reclaimed[i] {
			return false
		}
	}
	return true
}

func equalPtr(a, b *Lease) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
