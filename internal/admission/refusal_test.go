package admission

import (
	"testing"
	"time"
)

func TestRefusalsAreJudgedAgainstAnExactBucket(t *testing.T) {
	const q = "q"
	s := time.Second
	adm := func(at time.Duration, cost float64) Record {
		return Record{At: at, Quota: q, Cost: cost, Allowed: true}
	}
	ref := func(at, lat time.Duration, cost float64) Record {
		return Record{At: at, Latency: lat, Quota: q, Cost: cost}
	}
	for _, c := range []struct {
		name  string
		recs  []Record
		false int
	}{
		{"refused with the bucket full", []Record{ref(0, 0, 1)}, 1},
		{"refused once the burst is spent", []Record{adm(0, 1), adm(0, 1), ref(0, 0, 1)}, 0},
		{"refused after the refill", []Record{adm(0, 1), adm(0, 1), ref(s, 0, 1)}, 1},
		{"refused before the refill is whole", []Record{adm(0, 1), adm(0, 1), ref(s/2, 0, 1)}, 0},
		{"its latency reaches back before the refill", []Record{adm(0, 1), adm(0, 1), ref(s, s/2+1, 1)}, 0},
		{"a larger cost than the bucket holds", []Record{adm(0, 1), ref(0, 0, 2)}, 0},
		{"a cost the bucket holds, besides one admitted", []Record{adm(0, 1), ref(0, 0, 1)}, 1},
		{"an admission known later may have come first", []Record{adm(0, 1), ref(s/10, 0, 1), {At: s / 5, Latency: s / 5, Quota: q, Cost: 1, Allowed: true}}, 0},
		{"an admission decided after it does not excuse it", []Record{adm(0, 1), ref(s/10, 0, 1), adm(s/5, 1)}, 1},
		{"another quota's refusal is not judged", []Record{{At: 0, Quota: "other", Cost: 1}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			Sort(c.recs)
			rep := Check(c.recs, q, 2, 1) // B 2, r 1/s
			if rep.Refusals.False != c.false || len(rep.Refusals.At) != c.false {
				t.Fatalf("false refusals %d (at %v), want %d", rep.Refusals.False, rep.Refusals.At, c.false)
			}
		})
	}
}

func TestRecorderDenyIsARefusal(t *testing.T) {
	r := NewRecorder()
	r.Admit("a", "q", 1)
	r.Deny("a", "q", 1)
	rep := Check(r.Records(), "q", 5, 0)
	if rep.Refusals.Refused != 1 || rep.Refusals.False != 1 || rep.Admitted != 1 {
		t.Fatalf("refusals %+v, admitted %v: want 1 refused, false (4 of 5 left), 1 admitted", rep.Refusals, rep.Admitted)
	}
}

// Spans are judged as records of [From, To], each refusal against the
// burst its span may have had.
func TestSpanRefusalsHoldEachToItsBurst(t *testing.T) {
	s := time.Second
	sp := func(from, to time.Duration, cost float64) Span { return Span{From: from, To: to, Cost: cost} }
	adm := []Span{sp(0, s/10, 1), sp(0, s/10, 1)}
	for _, c := range []struct {
		name    string
		refused Span
		burst   float64
		false   int
	}{
		{"burst spent", sp(s/5, s/4, 1), 2, 0},
		{"room in a larger burst", sp(s/5, s/4, 1), 3, 1},
		{"an admission's span reaches past the refusal's start", sp(s/20, s/20, 1), 3, 1},
		{"refused after the refill", sp(2*s, 2*s, 1), 2, 1},
		{"its span reaches back before the refill", sp(s/2, 2*s, 1), 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := SpanRefusals(adm, []Span{c.refused}, 1, func(Span) float64 { return c.burst })
			if got.Refused != 1 || got.False != c.false {
				t.Fatalf("refusals %+v, want 1 refused, %d false", got, c.false)
			}
		})
	}
}
