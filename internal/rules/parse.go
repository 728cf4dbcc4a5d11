package rules

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/region"
)

const (
	// maxProblems caps what one Parse reports, so a file of garbage gives a
	// readable answer rather than megabytes of errors.
	maxProblems = 100
	// maxVisits caps the mapping entries the walk visits. Aliases let a small
	// file name one large mapping many times (a "billion laughs"); the
	// largest valid file has about 31,000 entries.
	maxVisits = 200_000
)

// Load reads filename and parses it. An unreadable file wraps the os error
// (errors.Is(err, fs.ErrNotExist) works); an invalid one wraps ErrInvalidFile.
func Load(filename string) (*Set, error) {
	data, err := readFile(filename)
	if err != nil {
		return nil, err
	}
	return Parse(filename, data)
}

// readFile reads at most MaxFileSize+1 bytes, so a runaway file cannot
// exhaust memory; Parse rejects the extra byte.
func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("rules: read %s: %w", name, err)
	}
	return data, nil
}

// Parse parses and validates a rules file. filename is used only in error
// messages. On any problem it returns a nil Set and every problem found
// (up to 100), each a *Problem wrapping ErrInvalidFile, joined with
// errors.Join in file order.
func Parse(filename string, data []byte) (*Set, error) {
	p := &parser{file: filename}
	rules := p.parse(data)
	if len(p.problems) > 0 {
		return nil, p.err()
	}
	return newSet(rules, data), nil
}

type parser struct {
	file     string
	problems []*Problem
	dropped  int
	visits   int
}

// visit charges n mapping entries to the walk's budget and reports false,
// once with a problem, when it is spent.
func (p *parser) visit(at *yaml.Node, n int) bool {
	if p.visits > maxVisits {
		return false
	}
	p.visits += n
	if p.visits > maxVisits {
		// Past the cap too: it explains why the walk stopped.
		p.problems = append(p.problems, &Problem{File: p.file, Line: at.Line, Column: at.Column,
			Msg: fmt.Sprintf("the file expands to more than %d fields (excessive aliasing); stopped here", maxVisits)})
		return false
	}
	return true
}

// ruleSrc is a rule being parsed: where each field was written, and which
// fields already have a problem reported, so validate does not repeat it
// ("burst: required" followed by "burst: must be > 0" helps nobody).
type ruleSrc struct {
	rule  *Rule
	field string // "rules[3]"
	node  *yaml.Node
	pos   map[string]*yaml.Node // relative field -> node to point at
	bad   map[string]bool       // relative fields already reported
	// autoPending fills auto.regions defaults once the block is read.
	autoPending func()
}

func (p *parser) full() bool { return len(p.problems) >= maxProblems }

func (p *parser) add(line, col int, field, format string, args ...any) {
	if p.full() {
		p.dropped++
		return
	}
	p.problems = append(p.problems, &Problem{File: p.file, Line: line, Column: col, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) at(n *yaml.Node, field, format string, args ...any) {
	p.add(n.Line, n.Column, field, format, args...)
}

func (p *parser) err() error {
	slices.SortStableFunc(p.problems, func(a, b *Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	errs := make([]error, 0, len(p.problems)+1)
	for _, pr := range p.problems {
		errs = append(errs, pr)
	}
	if p.dropped > 0 {
		errs = append(errs, &Problem{File: p.file, Msg: fmt.Sprintf("%d more problems not shown", p.dropped)})
	}
	return errors.Join(errs...)
}

var (
	yamlLine     = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	yamlAnchor   = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)
	readerPrefix = regexp.MustCompile(`^(invalid|incomplete|control characters|unexpected low|expected low|input error)`)
)

// parserProblems are the messages of the YAML library's parser stage. It
// prints their line 0-based (its scanner's, 1-based), so the line must be
// corrected by which stage failed.
var parserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"did not find expected node content":     true,
	"did not find expected key":              true,
	"did not find expected '-' indicator":    true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
	"found undefined tag handle":             true,
}

// syntax reports a YAML syntax error at the best position the library's
// message allows. It gives a line (sometimes off by one, sometimes omitted
// on the first line) but never a column, except where the position can be
// found again from the input.
func (p *parser) syntax(data []byte, err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlAnchor.FindStringSubmatch(err.Error()); m != nil {
		line, col := position(data, bytes.Index(data, []byte("*"+m[1])))
		p.add(line, col, "", "YAML error: %s", msg)
		return
	}
	line := 0
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	switch {
	case readerPrefix.MatchString(msg):
		if line, col := position(data, firstBadChar(data)); line > 0 {
			p.add(line, col, "", "YAML syntax error: %s", msg)
			return
		}
	case parserProblems[msg]:
		line++
	case line == 0:
		line = 1
	}
	p.add(line, 0, "", "YAML syntax error: %s", msg)
}

// position turns a byte offset into a 1-based line and column (in
// characters); 0, 0 for a negative offset.
func position(data []byte, off int) (line, col int) {
	if off < 0 || off > len(data) {
		return 0, 0
	}
	before := data[:off]
	line = 1 + bytes.Count(before, []byte("\n"))
	col = 1 + utf8.RuneCount(before[bytes.LastIndexByte(before, '\n')+1:])
	return line, col
}

// firstBadChar finds the first byte YAML refuses: invalid UTF-8 or a
// character outside YAML's printable set. -1 when there is none (the input
// may be UTF-16, which this does not decode).
func firstBadChar(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		ok := r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r <= 0x7e || r == 0x85 ||
			r >= 0xa0 && r <= 0xd7ff || r >= 0xe000 && r <= 0xfffd || r >= 0x10000 && r <= 0x10ffff
		if r == utf8.RuneError && n <= 1 || !ok {
			return i
		}
		i += n
	}
	return -1
}

func (p *parser) parse(data []byte) []*Rule {
	if len(data) > MaxFileSize {
		p.add(0, 0, "", "file is larger than %d bytes", MaxFileSize)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			// Refused rather than read as "no rules": a truncated write or
			// an empty ConfigMap key must not silently lift every limit.
			p.add(0, 0, "", "file is empty; it must have a rules list (write \"rules: []\" to mean no rules)")
		} else {
			p.syntax(data, err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		at := &extra
		if len(extra.Content) > 0 {
			at = extra.Content[0]
		}
		p.at(at, "", "a second YAML document; put every rule in the first")
	} else if !errors.Is(err, io.EOF) {
		p.syntax(data, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = deref(root.Content[0])
	}
	var rulesNode *yaml.Node
	ok := p.fields(root, "", "the file", []string{"rules"}, func(name string, _, v *yaml.Node) {
		rulesNode = v
	})
	if !ok {
		return nil
	}
	if rulesNode == nil {
		p.at(root, "rules", "required")
		return nil
	}
	if rulesNode.Kind != yaml.SequenceNode {
		p.at(rulesNode, "rules", "must be a list of rules, got %s", describe(rulesNode))
		return nil
	}
	if n := len(rulesNode.Content); n > MaxRules {
		p.at(rulesNode, "rules", "has %d rules, at most %d", n, MaxRules)
	}
	srcs := make([]*ruleSrc, 0, len(rulesNode.Content))
	for i, item := range rulesNode.Content {
		if src := p.rule(i, deref(item)); src != nil {
			srcs = append(srcs, src)
		}
	}
	first := map[string]*ruleSrc{}
	for _, src := range srcs {
		if src.bad["name"] {
			continue
		}
		if prev, dup := first[src.rule.Name]; dup {
			p.at(src.pos["name"], src.field+".name", "duplicate rule name %q; first defined at line %d (%s)",
				src.rule.Name, prev.pos["name"].Line, prev.field)
			continue
		}
		first[src.rule.Name] = src
	}
	rules := make([]*Rule, len(srcs))
	for i, src := range srcs {
		rules[i] = src.rule
	}
	return rules
}

// deref follows aliases. The parser only creates aliases to anchors already
// seen, and the schema has a fixed depth, so aliases cannot make the walk
// loop or blow up: each kind check below stops a cycle.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing (null)"
		case "!!str":
			return fmt.Sprintf("the string %s", quote(n.Value))
		case "!!int", "!!float", "!!bool":
			return quote(n.Value)
		}
		return fmt.Sprintf("%s tagged %s", quote(n.Value), n.ShortTag())
	case yaml.AliasNode:
		return "an alias"
	}
	return "an empty document"
}

// quote shows a value in a message, shortened: values come from the file and
// may be long.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}

// fields walks a mapping with a fixed set of keys, reporting a non-mapping,
// bad keys, duplicates and unknown fields, and calls fn for each known field
// (value dereferenced). what names the mapping in messages. It returns false
// when n is not a mapping.
func (p *parser) fields(n *yaml.Node, field, what string, known []string, fn func(name string, k, v *yaml.Node)) bool {
	if n.Kind != yaml.MappingNode {
		p.at(n, field, "%s must be a mapping with the fields %s, got %s", what, strings.Join(known, ", "), describe(n))
		return false
	}
	if !p.visit(n, len(n.Content)/2) {
		return false
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		name, ok := p.key(k, field)
		if !ok {
			continue
		}
		f := join(field, name)
		if prev, dup := seen[name]; dup {
			p.at(k, f, "set twice (first at line %d)", prev.Line)
			continue
		}
		seen[name] = k
		if !slices.Contains(known, name) {
			if p.full() {
				p.dropped++ // formatting costs, and aliases can repeat this a lot
				continue
			}
			p.at(k, join(field, quoteField(name)), "unknown field; the fields are %s", strings.Join(known, ", "))
			continue
		}
		fn(name, k, v)
	}
	return true
}

func join(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// quoteField shows an unknown key as written when it is plain, quoted when
// it could confuse the reader.
func quoteField(name string) string {
	if f := matchField(name); strings.HasPrefix(f, "match.") {
		return name
	}
	return quote(name)
}

// key reads a mapping key. Keys are scalars; a number or boolean counts as
// the text written. Merge keys (<<) are refused, not silently ignored.
func (p *parser) key(k *yaml.Node, field string) (string, bool) {
	if k.Kind != yaml.ScalarNode {
		p.at(k, field, "a key must be a plain string, got %s", describe(k))
		return "", false
	}
	switch k.ShortTag() {
	case "!!str", "!!int", "!!float", "!!bool":
		return k.Value, true
	case "!!merge":
		p.at(k, field, "merge keys (<<) are not supported; write the fields out")
	default:
		p.at(k, field, "a key must be a plain string, got %s (tag %s)", describe(k), k.ShortTag())
	}
	return "", false
}

// text reads a scalar as written. Numbers and booleans count as their text:
// a descriptor value of 404 is the string "404".
func (p *parser) text(v *yaml.Node, field string) (string, bool) {
	if v.Kind == yaml.ScalarNode {
		switch v.ShortTag() {
		case "!!str", "!!int", "!!float", "!!bool":
			return v.Value, true
		}
	}
	p.at(v, field, "must be a string, got %s", describe(v))
	return "", false
}

func (p *parser) number(v *yaml.Node, field string) (float64, bool) {
	if v.Kind == yaml.ScalarNode {
		switch v.ShortTag() {
		case "!!int", "!!float":
			var f float64
			if err := v.Decode(&f); err == nil {
				return f, true
			}
		}
	}
	p.at(v, field, "must be a number, got %s", describe(v))
	return 0, false
}

// count reads a whole number. Its range is validate's: this only refuses
// what is not a whole number, or does not fit an int.
func (p *parser) count(v *yaml.Node, field string) (int, bool) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!int" {
		var n int
		if err := v.Decode(&n); err == nil {
			return n, true
		}
	}
	p.at(v, field, "must be a whole number, got %s", describe(v))
	return 0, false
}

var rateUnits = map[string]float64{"s": 1, "m": 60, "h": 3600}

// rate reads tokens per second: a number, or "N/s", "N/m", "N/h".
func (p *parser) rate(v *yaml.Node, field string) (float64, bool) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
		if num, unit, ok := strings.Cut(v.Value, "/"); ok {
			per, known := rateUnits[strings.TrimSpace(unit)]
			f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
			if known && err == nil {
				return f / per, true
			}
		}
		p.at(v, field, `must be tokens per second (a number) or a string like "10/s", "600/m", "36000/h"; got %s`, describe(v))
		return 0, false
	}
	return p.number(v, field)
}

func (p *parser) duration(v *yaml.Node, field string) (time.Duration, bool) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
		if d, err := time.ParseDuration(v.Value); err == nil {
			return d, true
		}
	}
	p.at(v, field, "must be a duration with a unit, like 30s or 1m30s; got %s", describe(v))
	return 0, false
}

func (p *parser) boolean(v *yaml.Node, field string) (bool, bool) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!bool" {
		var b bool
		if err := v.Decode(&b); err == nil {
			return b, true
		}
	}
	p.at(v, field, "must be true or false, got %s", describe(v))
	return false, false
}

func (p *parser) enum(v *yaml.Node, field string, names []string) (int, bool) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
		if i := slices.Index(names, v.Value); i >= 0 {
			return i, true
		}
	}
	got := describe(v)
	if v.Kind == yaml.ScalarNode {
		got = quote(v.Value)
	}
	p.at(v, field, "%s is not one of %s", got, joinNames(names))
	return 0, false
}

var emergencyFields = []string{"burst", "rate", "max_duration"}

var ruleFields = []string{"name", "match", "burst", "rate", "mode", "on_failure", "emergency", "shadow", "lease", "auto", "scope", "regions", "allow_overshoot"}

// rule parses rules[i]. It returns nil only when the item is not a mapping.
func (p *parser) rule(i int, n *yaml.Node) *ruleSrc {
	src := &ruleSrc{
		rule:  &Rule{Line: n.Line},
		field: fmt.Sprintf("rules[%d]", i),
		node:  n,
		pos:   map[string]*yaml.Node{},
		bad:   map[string]bool{},
	}
	r := src.rule
	seen := map[string]bool{}
	ok := p.fields(n, src.field, "a rule", ruleFields, func(name string, k, v *yaml.Node) {
		seen[name] = true
		src.pos[name] = v
		f := src.field + "." + name
		var ok bool
		switch name {
		case "name":
			r.Name, ok = p.text(v, f)
		case "match":
			ok = p.match(src, v)
		case "burst":
			r.Burst, ok = p.number(v, f)
		case "rate":
			r.Rate, ok = p.rate(v, f)
		case "mode":
			var m int
			m, ok = p.enum(v, f, modeNames)
			r.Mode = Mode(m)
		case "on_failure":
			var m int
			m, ok = p.enum(v, f, policyNames)
			r.OnFailure = Policy(m)
		case "shadow":
			r.Shadow, ok = p.boolean(v, f)
		case "emergency":
			src.pos[name] = k
			ok = p.emergency(src, v)
		case "lease":
			src.pos[name] = k
			ok = p.lease(src, v)
		case "auto":
			src.pos[name] = k
			ok = p.auto(src, v, seen)
		case "scope":
			var sc int
			sc, ok = p.enum(v, f, region.ScopeNames)
			r.Scope = region.Scope(sc)
		case "regions":
			src.pos[name] = k
			ok = p.regions(src, v)
		case "allow_overshoot":
			r.AllowOvershoot, ok = p.boolean(v, f)
		}
		if !ok {
			src.bad[name] = true
		}
	})
	if !ok {
		return nil
	}
	for _, name := range []string{"name", "match", "burst", "rate"} {
		if !seen[name] {
			p.at(n, src.field+"."+name, "required")
			src.bad[name] = true
		}
	}
	// A block that can never be used is a mistake, not a default.
	switch {
	case src.bad["on_failure"]:
		src.bad["emergency"] = true
	case seen["emergency"] && r.OnFailure != Emergency:
		p.at(src.pos["emergency"], src.field+".emergency", "is set, but on_failure is %v: it would never be used; remove it or set on_failure: emergency", r.OnFailure)
		src.bad["emergency"] = true
	case !seen["emergency"] && r.OnFailure == Emergency:
		p.at(src.pos["on_failure"], src.field+".emergency", "required when on_failure is emergency (burst, rate, max_duration)")
		src.bad["emergency"] = true
	case seen["emergency"] && !src.bad["emergency"]:
		// Only a block in use has required fields: a dead block is one
		// problem, not four.
		for _, name := range emergencyFields {
			if src.pos["emergency."+name] == nil {
				p.at(src.pos["emergency"], src.field+".emergency."+name, "required")
				src.bad["emergency."+name] = true
			}
		}
	}
	switch {
	case src.bad["mode"]:
		src.bad["lease"] = true
	case seen["lease"] && !r.Mode.Leases():
		p.at(src.pos["lease"], src.field+".lease", "is set, but mode is %v: it would never be used; remove it or set mode: leased (or auto)", r.Mode)
		src.bad["lease"] = true
	case r.Mode.Leases() && !seen["lease"]:
		r.Lease.Period = DefaultLeasePeriod
	}
	switch {
	case src.bad["mode"]:
		src.bad["auto"] = true
	case seen["auto"] && r.Mode != ModeAuto:
		p.at(src.pos["auto"], src.field+".auto", "is set, but mode is %v: it would never be used; remove it or set mode: auto", r.Mode)
		src.bad["auto"] = true
	case r.Mode == ModeAuto && !seen["auto"]:
		defaultAuto(&r.Auto, seen)
	}
	for _, fp := range r.validate() {
		if src.reported(fp.field) {
			continue
		}
		p.at(src.where(fp.field), src.field+"."+fp.field, "%s", fp.msg)
	}
	return src
}

// reported says whether field, or a block containing it, already has a
// problem reported.
func (src *ruleSrc) reported(field string) bool {
	for f := field; ; {
		if src.bad[f] {
			return true
		}
		i := strings.LastIndexByte(f, '.')
		if i < 0 {
			return false
		}
		f = f[:i]
	}
}

// where is the node to point at for field: the field itself, else the
// nearest enclosing block that was written, else the rule.
func (src *ruleSrc) where(field string) *yaml.Node {
	for f := field; ; {
		if n := src.pos[f]; n != nil {
			return n
		}
		i := strings.LastIndexByte(f, '.')
		if i < 0 {
			return src.node
		}
		f = f[:i]
	}
}

func (p *parser) match(src *ruleSrc, v *yaml.Node) bool {
	field := src.field + ".match"
	if v.Kind != yaml.MappingNode {
		p.at(v, field, "must be a mapping of descriptor keys to values (%q for any value), got %s", Wildcard, describe(v))
		return false
	}
	// Checked before the walk: an aliased mapping may be huge and used by
	// every rule.
	if n := len(v.Content) / 2; n > MaxMatchKeys {
		p.at(v, field, "has %d keys, at most %d", n, MaxMatchKeys)
		return false
	}
	if !p.visit(v, len(v.Content)/2) {
		return false
	}
	src.rule.Match = make(map[string]string, len(v.Content)/2)
	ok := true
	for i := 0; i+1 < len(v.Content); i += 2 {
		kn, vn := deref(v.Content[i]), deref(v.Content[i+1])
		k, kok := p.key(kn, field)
		if !kok {
			ok = false
			continue
		}
		rel := matchField(k)
		f := src.field + "." + rel
		if _, dup := src.rule.Match[k]; dup {
			p.at(kn, f, "key set twice (first at line %d)", src.pos[rel].Line)
			ok = false
			continue
		}
		src.pos[rel] = kn
		if vn.Kind == yaml.ScalarNode && vn.ShortTag() == "!!null" {
			p.at(vn, f, "value required; use %q to match any value", Wildcard)
			src.bad[rel] = true
			src.rule.Match[k] = Wildcard // keeps the key counted and the checks quiet
			continue
		}
		val, vok := p.text(vn, f)
		if !vok {
			src.bad[rel] = true
			val = Wildcard
		}
		src.rule.Match[k] = val
	}
	return ok
}

func (p *parser) emergency(src *ruleSrc, v *yaml.Node) bool {
	field := src.field + ".emergency"
	e := &src.rule.Emergency
	return p.fields(v, field, "emergency", emergencyFields, func(name string, _, v *yaml.Node) {
		rel := "emergency." + name
		src.pos[rel] = v
		var ok bool
		switch name {
		case "burst":
			e.Burst, ok = p.number(v, field+"."+name)
		case "rate":
			e.Rate, ok = p.rate(v, field+"."+name)
		case "max_duration":
			e.MaxDuration, ok = p.duration(v, field+"."+name)
		}
		if !ok {
			src.bad[rel] = true
		}
	})
}

func (p *parser) lease(src *ruleSrc, v *yaml.Node) bool {
	field := src.field + ".lease"
	l := &src.rule.Lease
	l.Period = DefaultLeasePeriod
	return p.fields(v, field, "lease", []string{"period", "min_slice", "max_slice", "max_subjects", "default_share"}, func(name string, _, v *yaml.Node) {
		rel := "lease." + name
		src.pos[rel] = v
		var ok bool
		switch name {
		case "period":
			l.Period, ok = p.duration(v, field+"."+name)
		case "min_slice":
			l.MinSlice, ok = p.number(v, field+"."+name)
		case "max_slice":
			l.MaxSlice, ok = p.number(v, field+"."+name)
		case "max_subjects":
			l.MaxSubjects, ok = p.count(v, field+"."+name)
		case "default_share":
			l.DefaultShare, ok = p.number(v, field+"."+name)
		}
		if !ok {
			src.bad[rel] = true
		}
	})
}

var regionFields = []string{"weight", "safe_share"}

// regions parses regions: {ID: {weight: W, safe_share: S}, ...}. weight
// defaults to 1, safe_share to 0.
func (p *parser) regions(src *ruleSrc, v *yaml.Node) bool {
	src.rule.Regions = make(map[region.ID]region.Weight, len(v.Content)/2)
	return p.regionMap(src, v, "regions", "{weight, safe_share}", func(id region.ID, rel string, vn *yaml.Node) {
		w := region.Weight{Weight: 1}
		if vn.Kind == yaml.ScalarNode && vn.ShortTag() == "!!null" {
			src.rule.Regions[id] = w // "eu:" alone: weight 1, no safe share
			return
		}
		p.fields(vn, src.field+"."+rel, "a region", regionFields, func(name string, _, fv *yaml.Node) {
			src.pos[rel+"."+name] = fv
			var fok bool
			switch name {
			case "weight":
				w.Weight, fok = p.number(fv, src.field+"."+rel+"."+name)
			case "safe_share":
				w.SafeShare, fok = p.rate(fv, src.field+"."+rel+"."+name)
			}
			if !fok {
				src.bad[rel+"."+name] = true
			}
		})
		src.rule.Regions[id] = w
	})
}

// regionMap checks that v, the rule's block at relative field block
// ("regions", "auto.regions"), is a mapping of at most region.MaxRegions
// region names to what want describes, and calls each once per region, in
// file order, with the region's relative field (block.name, or
// block["name"] for a name that is not a valid region id, which the
// rule's validation reports). A region named twice is reported, not
// passed on.
func (p *parser) regionMap(src *ruleSrc, v *yaml.Node, block, want string, each func(id region.ID, rel string, vn *yaml.Node)) bool {
	field := src.field + "." + block
	if v.Kind != yaml.MappingNode {
		p.at(v, field, "must be a mapping of region names to %s, got %s", want, describe(v))
		return false
	}
	if n := len(v.Content) / 2; n > region.MaxRegions {
		p.at(v, field, "has %d regions, at most %d", n, region.MaxRegions)
		return false
	}
	if !p.visit(v, len(v.Content)/2) {
		return false
	}
	seen := make(map[region.ID]bool, len(v.Content)/2)
	ok := true
	for i := 0; i+1 < len(v.Content); i += 2 {
		kn, vn := deref(v.Content[i]), deref(v.Content[i+1])
		k, kok := p.key(kn, field)
		if !kok {
			ok = false
			continue
		}
		id := region.ID(k)
		rel := block + "." + k
		if id.Check() != "" {
			rel = block + "[" + strconv.Quote(k) + "]"
		}
		if seen[id] {
			p.at(kn, src.field+"."+rel, "region set twice (first at line %d)", src.pos[rel].Line)
			ok = false
			continue
		}
		seen[id] = true
		src.pos[rel] = kn
		each(id, rel, vn)
	}
	return ok
}
