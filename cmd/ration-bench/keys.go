package main

import (
	"math/rand/v2"
	"sort"
	"strconv"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// keyDist draws key indexes in [0, keys). One per worker: not safe for
// concurrent use.
type keyDist interface {
	next() int
}

// newKeyDist returns the distribution named by dist (Config.Check has
// vetted the arguments).
func newKeyDist(dist string, keys int, s float64, r *rand.Rand) keyDist {
	switch dist {
	case distHot:
		return hotDist{}
	case distZipf:
		// P(k) ∝ (1+k)^-s for k in [0, keys): key 0 is the hottest.
		return zipfDist{rand.NewZipf(r, s, 1, uint64(keys-1))}
	default:
		return uniformDist{r: r, n: keys}
	}
}

type uniformDist struct {
	r *rand.Rand
	n int
}

func (u uniformDist) next() int { return u.r.IntN(u.n) }

type zipfDist struct{ z *rand.Zipf }

func (z zipfDist) next() int { return int(z.z.Uint64()) }

// hotDist is every request on one key.
type hotDist struct{}

func (hotDist) next() int { return 0 }

// rulePicker chooses a rule per request by weight.
type rulePicker struct {
	r     *rand.Rand
	names []string
	cum   []float64 // cumulative weights
}

func newRulePicker(mix []weightedRule, r *rand.Rand) *rulePicker {
	p := &rulePicker{r: r}
	total := 0.0
	for _, w := range mix {
		total += w.Weight
		p.names = append(p.names, w.Rule)
		p.cum = append(p.cum, total)
	}
	return p
}

func (p *rulePicker) next() string {
	if len(p.names) == 1 {
		return p.names[0]
	}
	x := p.r.Float64() * p.cum[len(p.cum)-1]
	i := sort.SearchFloat64s(p.cum, x)
	if i < len(p.cum) && p.cum[i] == x {
		i++ // x on a boundary belongs to the next rule: [cum[i-1], cum[i])
	}
	return p.names[min(i, len(p.names)-1)]
}

// requestGen makes one worker's requests: a subject from the key
// distribution, and either a rule (-rule, -mix) or descriptors.
type requestGen struct {
	keys    keyDist
	rules   *rulePicker // nil: descriptors
	descKey string
	fixed   map[string]string
	prefix  string
	cost    float64
	buf     []byte
}

func newRequestGen(c Config, worker int) *requestGen {
	r := rand.New(rand.NewPCG(c.Seed, uint64(worker)))
	g := &requestGen{
		keys:    newKeyDist(c.Dist, c.Keys, c.ZipfS, r),
		descKey: c.DescriptorKey,
		fixed:   c.Descriptors,
		prefix:  c.KeyPrefix,
		cost:    c.Cost,
	}
	switch {
	case c.Rule != "":
		g.rules = newRulePicker([]weightedRule{{Rule: c.Rule, Weight: 1}}, r)
	case len(c.Mix) > 0:
		g.rules = newRulePicker(c.Mix, r)
	}
	return g
}

// subject draws the next subject.
func (g *requestGen) subject() string {
	g.buf = strconv.AppendInt(append(g.buf[:0], g.prefix...), int64(g.keys.next()), 10)
	return string(g.buf)
}

// fill sets r to the next request. r must be fresh (or reset).
func (g *requestGen) fill(r *rationv1.AllowRequest) {
	if g.cost != 1 {
		r.Cost = g.cost
	}
	if g.rules != nil {
		r.Rule = g.rules.next()
		r.Subject = g.subject()
		return
	}
	r.Descriptors = make(map[string]string, len(g.fixed)+1)
	for k, v := range g.fixed {
		r.Descriptors[k] = v
	}
	r.Descriptors[g.descKey] = g.subject()
}

// next returns a new request.
func (g *requestGen) next() *rationv1.AllowRequest {
	r := &rationv1.AllowRequest{}
	g.fill(r)
	return r
}
