package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Command encoding versions. A change to a command's fields that an older
// replica would misread bumps the version of the commands that use it;
// older replicas then stop with ErrUnknownCommand instead of diverging.
//
//   - 1: every kind as first released (JSON).
//   - 2: adds Grant.Config and ConfigureQuota's Rule and MaxSubjects.
//   - 3: adds QuotaConfig.StartEmpty (in Grant.Config and ConfigureQuota).
//   - 4: Renew in binary (binary.go), not JSON: every renewal is decoded
//     on every replica, and JSON decoding was the largest cost of applying
//     one. Only Renew has a version 4.
//   - 5: adds Fund.Seq (JSON). A replica older than it stops at the first
//     Fund a newer regional leader writes: upgrade followers first.
//
// A JSON command is encoded at the lowest version that has every field it
// sets (jsonVersionOf), so a command that sets no new field encodes exactly
// as before and older replicas still apply it; only a command that needs a
// newer field stops them. Renew is always encoded at version 4, so a
// replica older than version 4 stops at the first renewal a newer leader
// writes: upgrade a group followers first, the leader last. Renewals of
// version 1 (JSON, in logs written before) still decode.
const (
	commandVersion    = 1
	binaryVersion     = 4
	maxCommandVersion = 5
)

// commandVersionOf is the version c is encoded at. v must be value(c).
func commandVersionOf(v Command) byte {
	if v.Kind() == KindRenew {
		return binaryVersion
	}
	return jsonVersionOf(v)
}

// jsonVersionOf is the version c is encoded at in JSON: the lowest one that
// has every field c sets. v must be value(c).
func jsonVersionOf(v Command) byte {
	switch c := v.(type) {
	case Grant:
		if c.Config != nil && c.Config.StartEmpty {
			return 3
		}
		if c.Config != nil {
			return 2
		}
	case Fund:
		if c.Seq != 0 {
			return 5
		}
	case ConfigureQuota:
		if c.StartEmpty {
			return 3
		}
		if c.Rule != "" || c.MaxSubjects != 0 {
			return 2
		}
	}
	return commandVersion
}

// EncodeCommand encodes a command for the replicated log: one type byte (its
// Kind), one version byte (commandVersionOf), then the command: in binary
// at version 4 (Renew), else as JSON. It is deterministic.
// A command holding a NaN or infinity cannot be encoded (ErrInvalid).
func EncodeCommand(c Command) ([]byte, error) {
	v := value(c)
	if v == nil {
		return nil, fmt.Errorf("lease: encode %T: %w", c, ErrUnknownCommand)
	}
	if r, ok := v.(Renew); ok {
		return appendRenew(nil, r)
	}
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("lease: encode %s: %w: %v", v.Kind(), ErrInvalid, err)
	}
	out := make([]byte, 0, 2+len(body))
	out = append(out, byte(v.Kind()), jsonVersionOf(v))
	return append(out, body...), nil
}

// DecodeCommand decodes what EncodeCommand produced, and what it produced
// before (JSON renewals of version 1). An unknown type byte or version gives
// ErrUnknownCommand: the FSM must stop rather than skip an entry other
// replicas may apply. Anything else that does not decode strictly (unknown
// fields, trailing bytes, wrong types, a binary field not as the encoder
// writes it) gives ErrCorrupt. It never panics, and
// DecodeCommand(EncodeCommand(c)) equals c. It does not validate values:
// Apply does.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("lease: decode command: %d bytes, need at least 2: %w", len(b), ErrCorrupt)
	}
	kind, version, body := Kind(b[0]), b[1], b[2:]
	if version < commandVersion || version > maxCommandVersion {
		return nil, fmt.Errorf("lease: decode %s: version %d, know %d to %d: %w", kind, version, commandVersion, maxCommandVersion, ErrUnknownCommand)
	}
	if version == binaryVersion {
		if kind != KindRenew {
			return nil, fmt.Errorf("lease: decode %s: version %d is Renew's alone: %w", kind, version, ErrUnknownCommand)
		}
		r, err := decodeRenew(body)
		if err != nil {
			return nil, fmt.Errorf("lease: decode %s: %w: %v", kind, ErrCorrupt, err)
		}
		return r, nil
	}
	var (
		c   Command
		err error
	)
	switch kind {
	case KindConfigureQuota:
		c, err = decodeStrict[ConfigureQuota](body)
	case KindGrant:
		c, err = decodeStrict[Grant](body)
	case KindRenew:
		c, err = decodeStrict[Renew](body)
	case KindRelease:
		c, err = decodeStrict[Release](body)
	case KindTick:
		c, err = decodeStrict[Tick](body)
	case KindLeaderElected:
		c, err = decodeStrict[LeaderElected](body)
	case KindFund:
		c, err = decodeStrict[Fund](body)
	case KindTune:
		c, err = decodeStrict[Tune](body)
	default:
		return nil, fmt.Errorf("lease: decode command: %w: type byte %d", ErrUnknownCommand, b[0])
	}
	if err != nil {
		return nil, fmt.Errorf("lease: decode %s: %w: %v", kind, ErrCorrupt, err)
	}
	// One JSON encoding per command: a field the version does not have, or
	// a newer version than the command needs, is not what EncodeCommand
	// wrote (a JSON Renew is version 1, as logs written before version 4
	// hold it).
	if want := jsonVersionOf(c); want != version {
		return nil, fmt.Errorf("lease: decode %s: %w: version %d, but its fields are those of version %d", kind, ErrCorrupt, version, want)
	}
	return c, nil
}

// decodeStrict decodes exactly one JSON value with only known fields.
func decodeStrict[T any](b []byte) (T, error) {
	var v T
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return v, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

// Snapshot versions: 2 adds QuotaConfig's Rule and MaxSubjects and the
// answer code of ErrTooManySubjects; 3 adds QuotaConfig.StartEmpty; 4 adds
// the upstream sequence number funded last (UpstreamSeq). A state that uses none of them is
// written as version 1, byte for byte as before, so an older replica can
// still restore it; UnmarshalBinary reads both.
const (
	snapshotVersion    = 1
	maxSnapshotVersion = 4
)

// snapshotVersionOf is the lowest version that can hold s.
func (s *State) snapshotVersionOf() int {
	if s.upSeq != 0 {
		return 4
	}
	for _, q := range s.quotas {
		if q.base.StartEmpty {
			return 3
		}
	}
	for _, q := range s.quotas {
		if q.base.Rule != "" || q.base.MaxSubjects != 0 {
			return 2
		}
	}
	for _, h := range s.holders {
		if h.answer.Code == codeTooManySubjects {
			return 2
		}
	}
	return snapshotVersion
}

type snapshot struct {
	Version int            `json:"version"`
	Now     int64          `json:"now"`
	NextID  uint64         `json:"next_id"`
	Quotas  []quotaRecord  `json:"quotas"`
	Holders []holderRecord `json:"holders"`
	Tunings []Tuning       `json:"tunings,omitempty"`
	UpSeq   uint64         `json:"up_seq,omitempty"`
}

type quotaRecord struct {
	Name      string      `json:"name"`
	Config    QuotaConfig `json:"config"`
	Pool      float64     `json:"pool"`
	PoolAt    int64       `json:"pool_at"`
	CeilBurst float64     `json:"ceil_burst"`
	CeilRate  float64     `json:"ceil_rate"`
	Leases    []lease     `json:"leases"`
	// Base and Fund are set for funded quotas only (Config is then the
	// effective shape, Base plus Fund), so other snapshots are unchanged.
	Base *QuotaConfig `json:"base,omitempty"`
	Fund *Funding     `json:"fund,omitempty"`
}

type holderRecord struct {
	Name   string `json:"name"`
	Seq    uint64 `json:"seq"`
	At     int64  `json:"at"`
	Answer answer `json:"answer"`
}

// MarshalBinary encodes the whole state, deterministically: equal states
// give equal bytes (quotas and holders sorted by name, leases in the
// state's order, floats in their shortest exact form).
func (s *State) MarshalBinary() ([]byte, error) {
	snap := snapshot{Version: s.snapshotVersionOf(), Now: s.now, NextID: s.nextID, UpSeq: s.upSeq,
		Quotas: []quotaRecord{}, Holders: []holderRecord{}}
	for _, name := range s.Quotas() {
		q := s.quotas[name]
		r := quotaRecord{Name: name, Config: q.cfg, Pool: q.pool, PoolAt: q.poolAt,
			CeilBurst: q.ceilBurst, CeilRate: q.ceilRate, Leases: make([]lease, len(q.leases))}
		for i, l := range q.leases {
			r.Leases[i] = *l
		}
		if q.base.Funded {
			base, fund := q.base, q.fund
			r.Base, r.Fund = &base, &fund
		}
		snap.Quotas = append(snap.Quotas, r)
	}
	for _, name := range sortedKeys(s.holders) {
		h := s.holders[name]
		snap.Holders = append(snap.Holders, holderRecord{Name: name, Seq: h.seq, At: h.at, Answer: h.answer})
	}
	for _, k := range sortedKeys(s.tunings) {
		snap.Tunings = append(snap.Tunings, s.tunings[k])
	}
	b, err := json.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("lease: marshal state: %w", err)
	}
	return b, nil
}

// UnmarshalBinary replaces s with the state encoded in b. Bytes that do not
// decode, or decode into a state that breaks an invariant, give ErrCorrupt
// and leave s unchanged.
func (s *State) UnmarshalBinary(b []byte) error {
	snap, err := decodeStrict[snapshot](b)
	if err != nil {
		return fmt.Errorf("lease: unmarshal state: %w: %v", ErrCorrupt, err)
	}
	if snap.Version < snapshotVersion || snap.Version > maxSnapshotVersion {
		return fmt.Errorf("lease: unmarshal state: version %d, know %d to %d: %w", snap.Version, snapshotVersion, maxSnapshotVersion, ErrCorrupt)
	}
	n := New()
	n.now, n.nextID, n.upSeq = snap.Now, snap.NextID, snap.UpSeq
	for _, t := range snap.Tunings {
		if err := t.Check(); err != nil || t.Empty() || n.tunings[t.Key()].Rule != "" {
			return fmt.Errorf("lease: unmarshal state: tuning %q invalid, empty or repeated: %w", t.Key(), ErrCorrupt)
		}
		n.tunings[t.Key()] = t
	}
	for _, r := range snap.Holders {
		if r.Name == "" || n.holders[r.Name] != nil {
			return fmt.Errorf("lease: unmarshal state: holder %q empty or repeated: %w", r.Name, ErrCorrupt)
		}
		n.holders[r.Name] = &holder{seq: r.Seq, at: r.At, answer: r.Answer}
	}
	for _, r := range snap.Quotas {
		if r.Name == "" || n.quotas[r.Name] != nil {
			return fmt.Errorf("lease: unmarshal state: quota %q empty or repeated: %w", r.Name, ErrCorrupt)
		}
		q := &quota{name: r.Name, cfg: r.Config, base: r.Config, pool: r.Pool, poolAt: r.PoolAt,
			ceilBurst: r.CeilBurst, ceilRate: r.CeilRate, byHolder: map[string]*lease{}}
		if r.Base != nil {
			q.base = *r.Base
		}
		if r.Fund != nil {
			q.fund = *r.Fund
		}
		if q.base != r.Config && !q.base.Funded || q.base.Funded && q.effective() != r.Config {
			return fmt.Errorf("lease: unmarshal state: quota %q: config is not base plus funding: %w", r.Name, ErrCorrupt)
		}
		for i := range r.Leases {
			l := &r.Leases[i]
			h := n.holders[l.Holder]
			if h == nil || n.leases[l.ID] != nil || q.byHolder[l.Holder] != nil {
				return fmt.Errorf("lease: unmarshal state: lease %d of %q: holder unknown, or lease repeated: %w", l.ID, l.Holder, ErrCorrupt)
			}
			h.leases++
			n.leases[l.ID] = l
			q.byHolder[l.Holder] = l
			q.leases = append(q.leases, l)
		}
		q.rebuild(n.now)
		n.quotas[r.Name] = q
		n.count(q.base.Rule, 1)
	}
	if err := n.CheckInvariants(); err != nil {
		return fmt.Errorf("lease: unmarshal state: %w: %v", ErrCorrupt, err)
	}
	if v := n.snapshotVersionOf(); v != snap.Version {
		return fmt.Errorf("lease: unmarshal state: version %d, but its contents are those of version %d: %w", snap.Version, v, ErrCorrupt)
	}
	*s = *n
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
