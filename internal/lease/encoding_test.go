package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

// sampleCommands has one of each kind, with every field set.
func sampleCommands() []Command {
	return []Command{
		ConfigureQuota{Now: 1, Quota: "tenant=acme|POST /v1/search", Burst: 100.5, Rate: 10, LeasePeriod: 10 * sec, MinSlice: 0.25, MaxSlice: 50, SafetyMargin: sec},
		Grant{Now: 2, Holder: "agent-7/boot-3", Seq: 1, Quota: "q", Demand: 12.75, Weight: 2},
		Renew{Now: 3, Holder: "agent-7/boot-3", Seq: 2, Items: []RenewItem{
			{LeaseID: 1, Quota: "q", Unused: 0.1, Demand: 3, Weight: 1, ConfirmedCap: 1.0 / 3, ConfirmedRate: 2e-7},
			{LeaseID: 2, Quota: "ü", Unused: 0, Demand: 0},
		}},
		Release{Now: 4, Holder: "h", Seq: 3, LeaseID: 9, Unused: 7.125},
		Tick{Now: 5},
		LeaderElected{Now: MaxTime},
		Renew{Holder: "h", Seq: 1, Items: []RenewItem{}},
		Renew{Holder: "h", Seq: 1},
		ConfigureQuota{Now: 6, Quota: "per-tenant|acme", Burst: 5, Rate: 1, LeasePeriod: sec, Rule: "per-tenant", MaxSubjects: 1000},
		Grant{Now: 7, Holder: "h", Seq: 4, Quota: "per-tenant|acme", Demand: 1,
			Config: &QuotaConfig{Burst: 5, Rate: 1, LeasePeriod: sec, Funded: true, Rule: "per-tenant", MaxSubjects: 1000}},
		Renew{Now: -1, Holder: "", Seq: math.MaxUint64, Items: []RenewItem{
			{LeaseID: math.MaxUint64, Quota: "", Unused: math.MaxFloat64, Demand: math.SmallestNonzeroFloat64, Weight: -1,
				Bounds: &Bounds{Period: math.MinInt64, MinSlice: math.Copysign(0, -1), MaxSlice: -math.MaxFloat64}, ConfirmedCap: 1e-300, ConfirmedRate: 5e-324},
			{LeaseID: 0, Quota: "tenant=\xff\x00|q", Bounds: &Bounds{}},
			{LeaseID: 1 << 63, Quota: "per-tenant|acme", Unused: 2.5, Demand: 1e12, Weight: 1e6, ConfirmedCap: 80, ConfirmedRate: 8,
				Bounds: &Bounds{Period: 10 * sec, MinSlice: 0.5, MaxSlice: 8}},
		}},
	}
}

func TestEncodeDecodeCommand(t *testing.T) {
	for _, c := range sampleCommands() {
		t.Run(c.Kind().String(), func(t *testing.T) {
			b, err := EncodeCommand(c)
			if err != nil {
				t.Fatalf("EncodeCommand(%+v) = %v", c, err)
			}
			if b[0] != byte(c.Kind()) || b[1] != commandVersionOf(c) {
				t.Errorf("header = %v, want [%d %d]", b[:2], c.Kind(), commandVersionOf(c))
			}
			got, err := DecodeCommand(b)
			if err != nil {
				t.Fatalf("DecodeCommand(%q) = %v", b, err)
			}
			if !reflect.DeepEqual(got, c) {
				t.Errorf("DecodeCommand(EncodeCommand(c)) = %+v, want %+v", got, c)
			}
			again, _ := EncodeCommand(got)
			if !bytes.Equal(again, b) {
				t.Errorf("encoding is not deterministic: %q then %q", b, again)
			}
		})
	}
}

// TestCommandVersions: a command that sets none of version 2's fields is
// encoded exactly as version 1 was (older replicas still apply it, and
// entries already in logs decode as before); one that sets them is version
// 2, which an older replica refuses as unknown rather than misreads.
func TestCommandVersions(t *testing.T) {
	tests := []struct {
		name    string
		cmd     Command
		version byte
		// v1 is the encoding of the first release, where there is one.
		v1 string
	}{
		{"grant", Grant{Now: 2, Holder: "a", Seq: 1, Quota: "q", Demand: 1.5}, 1,
			`{"now":2,"holder":"a","seq":1,"quota":"q","demand":1.5}`},
		{"configure", ConfigureQuota{Now: 1, Quota: "q", Burst: 100, Rate: 10, LeasePeriod: 10 * sec, SafetyMargin: sec}, 1,
			`{"now":1,"quota":"q","burst":100,"rate":10,"lease_period":10000000,"min_slice":0,"max_slice":0,"safety_margin":1000000}`},
		{"grant with config", Grant{Holder: "a", Seq: 1, Quota: "q", Config: &QuotaConfig{Burst: 1, LeasePeriod: sec}}, 2, ""},
		{"configure with rule", ConfigureQuota{Quota: "q", Burst: 1, LeasePeriod: sec, Rule: "r"}, 2, ""},
		{"configure with max_subjects", ConfigureQuota{Quota: "q", Burst: 1, LeasePeriod: sec, Rule: "r", MaxSubjects: 2}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := EncodeCommand(tt.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if b[1] != tt.version {
				t.Errorf("version %d, want %d", b[1], tt.version)
			}
			if tt.v1 == "" {
				return
			}
			if got := string(b[2:]); got != tt.v1 {
				t.Errorf("encoding %s, want version 1's %s", got, tt.v1)
			}
			old := append([]byte{byte(tt.cmd.Kind()), 1}, tt.v1...)
			c, err := DecodeCommand(old)
			if err != nil || !reflect.DeepEqual(c, tt.cmd) {
				t.Errorf("DecodeCommand(version 1 %s) = %+v, %v; want %+v", tt.v1, c, err, tt.cmd)
			}
		})
	}
}

func TestEncodeCommandPointer(t *testing.T) {
	v, err := EncodeCommand(Tick{Now: 7})
	if err != nil {
		t.Fatal(err)
	}
	p, err := EncodeCommand(&Tick{Now: 7})
	if err != nil || !bytes.Equal(v, p) {
		t.Errorf("EncodeCommand(&Tick) = %q, %v; want %q", p, err, v)
	}
}

func TestEncodeCommandErrors(t *testing.T) {
	tests := []struct {
		name string
		cmd  Command
		want error
	}{
		{"nil", nil, ErrUnknownCommand},
		{"typed nil", (*Renew)(nil), ErrUnknownCommand},
		{"NaN", Grant{Holder: "h", Seq: 1, Quota: "q", Demand: math.NaN()}, ErrInvalid},
		{"infinity", Release{Holder: "h", Seq: 1, LeaseID: 1, Unused: math.Inf(1)}, ErrInvalid},
		{"renew NaN", Renew{Holder: "h", Seq: 1, Items: []RenewItem{{LeaseID: 1, Quota: "q", Demand: math.NaN()}}}, ErrInvalid},
		{"renew infinite bound", Renew{Holder: "h", Seq: 1, Items: []RenewItem{{LeaseID: 1, Quota: "q", Bounds: &Bounds{MaxSlice: math.Inf(-1)}}}}, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := EncodeCommand(tt.cmd); !errors.Is(err, tt.want) {
				t.Errorf("EncodeCommand(%v) = %v, want %v", tt.cmd, err, tt.want)
			}
		})
	}
}

func TestDecodeCommandErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"one byte", []byte{byte(KindTick)}, ErrCorrupt},
		{"unknown type", []byte{0, 1, '{', '}'}, ErrUnknownCommand},
		{"unknown high type", []byte{0x87, 1, '{', '}'}, ErrUnknownCommand},
		{"unknown version", []byte{byte(KindTick), maxCommandVersion + 1, '{', '}'}, ErrUnknownCommand},
		{"version 2 without its fields", []byte{byte(KindTick), 2, '{', '}'}, ErrCorrupt},
		{"grant version 2 without config", append([]byte{byte(KindGrant), 2}, `{"holder":"h","seq":1,"quota":"q"}`...), ErrCorrupt},
		{"grant version 1 with config", append([]byte{byte(KindGrant), 1}, `{"config":{"burst":1}}`...), ErrCorrupt},
		{"configure version 1 with max_subjects", append([]byte{byte(KindConfigureQuota), 1}, `{"quota":"q","max_subjects":3}`...), ErrCorrupt},
		{"version zero", []byte{byte(KindTick), 0, '{', '}'}, ErrUnknownCommand},
		{"no body", []byte{byte(KindTick), 1}, ErrCorrupt},
		{"unknown field", append([]byte{byte(KindTick), 1}, `{"now":1,"term":2}`...), ErrCorrupt},
		{"trailing data", append([]byte{byte(KindTick), 1}, `{"now":1}{}`...), ErrCorrupt},
		{"wrong type", append([]byte{byte(KindTick), 1}, `{"now":"1"}`...), ErrCorrupt},
		{"fraction into int", append([]byte{byte(KindTick), 1}, `{"now":1.5}`...), ErrCorrupt},
		{"negative seq", append([]byte{byte(KindGrant), 1}, `{"seq":-1}`...), ErrCorrupt},
		{"huge float", append([]byte{byte(KindGrant), 1}, `{"demand":1e400}`...), ErrCorrupt},
		{"truncated", append([]byte{byte(KindRenew), 1}, `{"items":[{"lease_id":1`...), ErrCorrupt},
		{"renew version 2", append([]byte{byte(KindRenew), 2}, `{"holder":"h","seq":1,"items":null}`...), ErrCorrupt},
		{"renew version 3", append([]byte{byte(KindRenew), 3}, `{"holder":"h","seq":1,"items":null}`...), ErrCorrupt},
		{"version 4 of a JSON kind", append([]byte{byte(KindTick), 4}, 0x02), ErrUnknownCommand},
		{"version 4 of grant", append([]byte{byte(KindGrant), 4}, `{}`...), ErrUnknownCommand},
		{"binary renew, JSON body", append([]byte{byte(KindRenew), 4}, `{"holder":"h","seq":1}`...), ErrCorrupt},
		{"binary renew, no body", []byte{byte(KindRenew), 4}, ErrCorrupt},
		{"binary renew, trailing byte", append(binaryRenew(), 0), ErrCorrupt},
		{"binary renew, truncated", binaryRenew()[:len(binaryRenew())-1], ErrCorrupt},
		{"binary renew, now not shortest", []byte{byte(KindRenew), 4, 0x80, 0x00, 0, 1, 0}, ErrCorrupt},
		{"binary renew, seq not shortest", []byte{byte(KindRenew), 4, 0, 0, 0x81, 0x00, 0}, ErrCorrupt},
		{"binary renew, seq too long", []byte{byte(KindRenew), 4, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0}, ErrCorrupt},
		{"binary renew, holder past the end", []byte{byte(KindRenew), 4, 0, 5, 'h', 1, 0}, ErrCorrupt},
		{"binary renew, more items than bytes", []byte{byte(KindRenew), 4, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}, ErrCorrupt},
		{"binary renew, NaN", binaryRenewWith(func(b []byte) { copy(b[len(b)-8:], []byte{0, 0, 0, 0, 0, 0, 0xf8, 0x7f}) }), ErrCorrupt},
		{"binary renew, infinity", binaryRenewWith(func(b []byte) { copy(b[len(b)-8:], []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x7f}) }), ErrCorrupt},
		{"binary renew, bounds marker 2", binaryRenewWith(func(b []byte) { b[len(b)-17] = 2 }), ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := DecodeCommand(tt.in)
			if !errors.Is(err, tt.want) || c != nil {
				t.Errorf("DecodeCommand(%q) = %v, %v; want nil, %v", tt.in, c, err, tt.want)
			}
		})
	}
}

// binaryRenew is a version 4 Renew of one item without bounds: its bounds
// marker is the 17th byte from the end, its last 8 bytes confirmed_rate.
func binaryRenew() []byte {
	b, err := EncodeCommand(Renew{Now: 1, Holder: "h", Seq: 2, Items: []RenewItem{{LeaseID: 3, Quota: "q", Demand: 1, ConfirmedRate: 1}}})
	if err != nil || b[1] != binaryVersion {
		panic(fmt.Sprint(b, err))
	}
	return b
}

func binaryRenewWith(change func([]byte)) []byte {
	b := binaryRenew()
	change(b)
	return b
}

// TestRenewVersions: a renewal is written in binary (version 4); renewals
// of version 1 (JSON), as logs written before version 4 hold them, still
// decode to the same command, which re-encodes in binary.
func TestRenewVersions(t *testing.T) {
	r := Renew{Now: 3, Holder: "agent-7/boot-3", Seq: 2, Items: []RenewItem{
		{LeaseID: 1, Quota: "q", Unused: 0.1, Demand: 3, Weight: 1, ConfirmedCap: 1.0 / 3, ConfirmedRate: 2e-7},
		{LeaseID: 2, Quota: "ü", Bounds: &Bounds{Period: sec, MinSlice: 0.5, MaxSlice: 4}},
	}}
	b, err := EncodeCommand(r)
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != byte(KindRenew) || b[1] != 4 {
		t.Fatalf("header %v, want [%d 4]", b[:2], KindRenew)
	}
	v1 := `{"now":3,"holder":"agent-7/boot-3","seq":2,"items":[` +
		`{"lease_id":1,"quota":"q","unused":0.1,"demand":3,"weight":1,"confirmed_cap":0.3333333333333333,"confirmed_rate":2e-7},` +
		`{"lease_id":2,"quota":"ü","unused":0,"demand":0,"bounds":{"period":1000000,"min_slice":0.5,"max_slice":4},"confirmed_cap":0,"confirmed_rate":0}]}`
	c, err := DecodeCommand(append([]byte{byte(KindRenew), 1}, v1...))
	if err != nil || !reflect.DeepEqual(c, r) {
		t.Fatalf("DecodeCommand(version 1 %s) = %+v, %v; want %+v", v1, c, err, r)
	}
	again, err := EncodeCommand(c)
	if err != nil || !bytes.Equal(again, b) {
		t.Errorf("version 1 renewal re-encoded as %q, %v; want %q", again, err, b)
	}
	// Smaller: the log, the disk and the followers carry less per renewal.
	if len(b) >= 2+len(v1) {
		t.Errorf("binary %d bytes, JSON %d", len(b), 2+len(v1))
	}
}

// FuzzDecodeRenew: the binary Renew decoder never panics, fails only with
// ErrCorrupt, and whatever it decodes re-encodes to the very same bytes (one
// encoding per command) and to a JSON renewal of version 1 that decodes to
// the same command (both decoders agree).
func FuzzDecodeRenew(f *testing.F) {
	for _, c := range sampleCommands() {
		if r, ok := c.(Renew); ok {
			b, err := EncodeCommand(r)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b[2:])
		}
	}
	f.Add(binaryRenew()[2:])
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		b := append([]byte{byte(KindRenew), binaryVersion}, body...)
		c, err := DecodeCommand(b)
		if err != nil {
			if c != nil || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeCommand = %v, %v; want nil, ErrCorrupt", c, err)
			}
			return
		}
		enc, err := EncodeCommand(c)
		if err != nil || !bytes.Equal(enc, b) {
			t.Fatalf("EncodeCommand(DecodeCommand(%q)) = %q, %v", b, enc, err)
		}
		js, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		r := c.(Renew)
		for _, it := range r.Items {
			if !utf8.ValidString(it.Quota) {
				return // JSON would replace the invalid bytes
			}
		}
		if !utf8.ValidString(r.Holder) {
			return
		}
		back, err := DecodeCommand(append([]byte{byte(KindRenew), 1}, js...))
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("JSON version 1 of %+v decodes to %+v, %v", c, back, err)
		}
	})
}

// FuzzDecodeCommand: decoding never panics, and whatever decodes re-encodes
// to something that decodes to the same command. Applying it never panics
// and never breaks an invariant.
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range sampleCommands() {
		b, err := EncodeCommand(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{byte(KindGrant), 1, 'n', 'u', 'l', 'l'})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			if c != nil {
				t.Fatalf("DecodeCommand returned %v with error %v", c, err)
			}
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownCommand) {
				t.Fatalf("DecodeCommand error %v wraps no sentinel", err)
			}
			return
		}
		enc, err := EncodeCommand(c)
		if err != nil {
			t.Fatalf("EncodeCommand(DecodeCommand(%q)) = %v", b, err)
		}
		if b[1] == binaryVersion && !bytes.Equal(enc, b) {
			t.Fatalf("binary %q re-encodes as %q", b, enc)
		}
		back, err := DecodeCommand(enc)
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("decode(encode(c)) = %+v, %v; want %+v", back, err, c)
		}
		s := fuzzState(t)
		if _, err := s.Apply(c); err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnknownQuota) &&
			!errors.Is(err, ErrStale) && !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("Apply(%+v) = %v: no sentinel", c, err)
		}
		if err := s.CheckInvariants(); err != nil {
			t.Fatalf("Apply(%+v) broke an invariant: %v", c, err)
		}
	})
}

// fuzzState is a small state with a quota "q" and a lease 1 held by "h".
func fuzzState(t *testing.T) *State {
	t.Helper()
	s := New()
	for _, c := range []Command{
		ConfigureQuota{Quota: "q", Burst: 100, Rate: 10, LeasePeriod: 10 * sec, SafetyMargin: sec},
		Grant{Holder: "h", Seq: 1, Quota: "q", Demand: 5},
	} {
		if _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestEncodeRoundTripProperty: decode(encode(c)) == c for random commands
// with any finite numbers and any valid UTF-8 names.
func TestEncodeRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		str := rapid.StringN(0, 20, -1)
		num := rapid.Float64()
		i64 := rapid.Int64()
		u64 := rapid.Uint64()
		var c Command
		switch rapid.IntRange(0, 5).Draw(t, "kind") {
		case 0:
			c = ConfigureQuota{Now: i64.Draw(t, "now"), Quota: str.Draw(t, "quota"), Burst: num.Draw(t, "b"), Rate: num.Draw(t, "r"),
				LeasePeriod: i64.Draw(t, "d"), MinSlice: num.Draw(t, "min"), MaxSlice: num.Draw(t, "max"), SafetyMargin: i64.Draw(t, "m")}
		case 1:
			c = Grant{Now: i64.Draw(t, "now"), Holder: str.Draw(t, "holder"), Seq: u64.Draw(t, "seq"), Quota: str.Draw(t, "quota"),
				Demand: num.Draw(t, "demand"), Weight: num.Draw(t, "weight")}
		case 2:
			r := Renew{Now: i64.Draw(t, "now"), Holder: str.Draw(t, "holder"), Seq: u64.Draw(t, "seq")}
			if rapid.Bool().Draw(t, "items") {
				r.Items = rapid.SliceOfN(rapid.Custom(func(t *rapid.T) RenewItem {
					it := RenewItem{LeaseID: u64.Draw(t, "id"), Quota: str.Draw(t, "quota"), Unused: num.Draw(t, "u"),
						Demand: num.Draw(t, "d"), Weight: num.Draw(t, "w"), ConfirmedCap: num.Draw(t, "cc"), ConfirmedRate: num.Draw(t, "cr")}
					if rapid.Bool().Draw(t, "bounds") {
						it.Bounds = &Bounds{Period: i64.Draw(t, "period"), MinSlice: num.Draw(t, "lo"), MaxSlice: num.Draw(t, "hi")}
					}
					return it
				}), 0, 5).Draw(t, "items")
			}
			c = r
		case 3:
			c = Release{Now: i64.Draw(t, "now"), Holder: str.Draw(t, "holder"), Seq: u64.Draw(t, "seq"), LeaseID: u64.Draw(t, "id"), Unused: num.Draw(t, "u")}
		case 4:
			c = Tick{Now: i64.Draw(t, "now")}
		case 5:
			c = LeaderElected{Now: i64.Draw(t, "now")}
		}
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatalf("EncodeCommand(%+v) = %v", c, err)
		}
		got, err := DecodeCommand(b)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("DecodeCommand(EncodeCommand(%+v)) = %+v, %v", c, got, err)
		}
	})
}
