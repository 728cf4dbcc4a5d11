package rules

import (
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/region"

	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
)

// maxWords is the size of Match's on-stack candidate bitset.
const maxWords = (MaxRules + 63) / 64

// Set is one version of the rules file. It is immutable after Parse and safe
// for concurrent use; a reload builds a new Set rather than changing one.
type Set struct {
	rules  []*Rule
	byName map[string]*Rule
	// index finds candidate rules from a few map lookups instead of testing
	// every rule: each rule is filed under one of its keys (an exact one when
	// it has one, since that is the most selective).
	index  []keyIndex
	hash   string
	digest [sha256.Size]byte
}

type keyIndex struct {
	key   string
	any   []uint16            // rules filed under key with "*"
	exact map[string][]uint16 // rules filed under key with this exact value
}

// newSet compiles valid rules (in file order) into a Set. data is the file
// content the Set is named after.
func newSet(rules []*Rule, data []byte) *Set {
	s := &Set{
		rules:  rules,
		byName: make(map[string]*Rule, len(rules)),
		digest: sha256.Sum256(data),
	}
	s.hash = hex.EncodeToString(s.digest[:8])
	byKey := map[string]*keyIndex{}
	for i, r := range rules {
		r.compile()
		s.byName[r.Name] = r
		j := slices.Index(r.wild, false) // first exact key
		if j < 0 {
			j = 0
		}
		k := r.keys[j]
		ki := byKey[k]
		if ki == nil {
			ki = &keyIndex{key: k, exact: map[string][]uint16{}}
			byKey[k] = ki
		}
		if r.wild[j] {
			ki.any = append(ki.any, uint16(i))
		} else {
			ki.exact[r.want[j]] = append(ki.exact[r.want[j]], uint16(i))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		s.index = append(s.index, *byKey[k])
	}
	return s
}

// compile builds the matcher fields from Match.
func (r *Rule) compile() {
	r.keys = slices.Sorted(maps.Keys(r.Match))
	r.want = make([]string, len(r.keys))
	r.wild = make([]bool, len(r.keys))
	r.prefix = make([]string, len(r.keys))
	r.subjLen = 0
	r.keyHead, r.key0 = bucket.KeyHead(r.Name), bucket.Key(r.Name, "")
	first := true
	for i, k := range r.keys {
		v := r.Match[k]
		if v != Wildcard {
			r.want[i] = v
			continue
		}
		r.wild[i] = true
		var b strings.Builder
		if !first {
			b.WriteByte(',')
		}
		first = false
		writeEscaped(&b, k)
		b.WriteByte('=')
		r.prefix[i] = b.String()
		r.subjLen += len(r.prefix[i])
	}
	r.shares = nil
	if r.Scope == region.ScopeGlobal && r.Mode == ModeRedis {
		r.shares = make(map[region.ID]bucket.Limit, len(r.Regions))
		for id, sh := range region.Splits(r.Burst, r.Rate, r.Regions) {
			r.shares[id] = bucket.Limit{Burst: sh.Burst, Rate: sh.Rate}
		}
	}
}

// Rules returns the rules in file order. The slice is a copy; the rules are
// shared and must not be modified.
func (s *Set) Rules() []*Rule { return slices.Clone(s.rules) }

// Rule returns the rule with this name.
func (s *Set) Rule(name string) (*Rule, bool) {
	r, ok := s.byName[name]
	return r, ok
}

// Hash identifies the file content the Set was parsed from: the first 16 hex
// digits of its SHA-256, so an operator can compare it with
// `sha256sum rules.yaml`. It is the rules_version in logs and metrics.
func (s *Set) Hash() string { return s.hash }
