// Package rules owns the rules file: its format, parsing and validation,
// matching a request's descriptors to rules (and naming the subject whose
// bucket each match charges), and reloading the file when it changes.
//
// A Set is one version of the file, immutable and safe for concurrent use.
// A Watcher swaps whole Sets atomically, so a decision sees the old rules or
// the new ones, never a mix, and an invalid file never replaces a valid one.
//
// Parse reports every problem in a file at once, each as
// FILE:LINE:COL: rules[i].field: message, and all wrap ErrInvalidFile.
//
// # Rules file reference
//
// The file is YAML with one top-level key, rules, a list of rules:
//
//	rules:
//	  - name: tenant-search
//	    match: {tenant: "*", endpoint: search}
//	    burst: 100
//	    rate: 600/m
//	    mode: redis
//	    on_failure: emergency
//	    emergency: {burst: 10, rate: 5, max_duration: 30s}
//	    shadow: false
//
// Fields of a rule:
//
//   - name (required): unique in the file; 1 to 63 characters matching
//     [a-z0-9][a-z0-9_.-]{0,62}. It is part of every Redis key of the rule,
//     so '{', '}' and '|' can never appear. Renaming a rule starts its
//     buckets afresh (full).
//   - match (required): a mapping of descriptor keys to values, 1 to 16
//     keys. A request matches when every key is present among its
//     descriptors with an equal value; "*" matches any value (including the
//     empty one) and gives each distinct value its own bucket. Other values
//     match exactly (case-sensitive; a number such as 404 is the text
//     "404"). Descriptors the rule does not name are ignored. Keys and values
//     are non-empty, at most 256 bytes, valid UTF-8. A literal "*" cannot be
//     matched exactly.
//   - burst (required): B, the bucket's capacity in tokens; a number in
//     (0, 1e12]. A request whose cost exceeds burst is always an error.
//   - rate (required): r, the refill in tokens per second; a number in
//     [0, 1e12], or a string "N/s", "N/m" or "N/h" ("600/m" is 10 per
//     second). 0 is a fixed allowance that never refills. Required even
//     then, so that forgetting it is an error rather than a silent lockout.
//   - mode: redis (default) keeps the bucket in the region's Redis primary;
//     leased decides locally from a budget slice leased from the coordinator
//     (hot keys, global quotas).
//   - on_failure: what to do when the store or coordinator cannot answer
//     within the decision timeout. fail_closed (default) rejects with HTTP
//     503; fail_open admits (unbounded overshoot while it lasts); emergency
//     admits from a per-agent bucket for a bounded time, then fails closed.
//   - emergency: required if and only if on_failure is emergency (a block
//     that would never be used is an error). All three fields required:
//     burst (b_e, tokens, in (0, 1e12]), rate (r_e, as for rate, in
//     [0, 1e12]), max_duration (T_e, a Go duration such as 30s or 1m30s,
//     > 0). With N agents cut off for P the overshoot is at most
//     N x (b_e + r_e x min(P, T_e)).
//   - shadow: true or false (default false). A shadow rule is evaluated and
//     counted like any other, but its denials are not enforced: the request
//     is admitted. Use it to try a new limit on real traffic.
//   - lease: only with mode: leased (an error otherwise); optional. period
//     (the lease length D, a Go duration > 0, default 10s), min_slice (the
//     least rate share of each lease holder, tokens/s, in [0, rate],
//     default 0), max_slice (the largest rate share, tokens/s, default 0
//     meaning no cap; otherwise in [min_slice, rate]); with rate 0 both are
//     held to burst/period instead (caps are then slice x period),
//     max_subjects (at most this many subjects
//     hold quotas at once, default 0 meaning no bound), default_share (a
//     fraction f in [0, 1], default 0, only with a "*" key: the part f of
//     every subject's budget is leased once per rule and each agent spends
//     its slice of it on every subject with no request to the coordinator;
//     the rest, 1-f, is leased per subject).
//
// Rules of the file as a whole: at most 1000 rules; the file is at most 16
// MiB and holds one YAML document; unknown fields, duplicate keys, YAML merge
// keys (<<) and an empty file are errors ("rules: []" means no rules).
// Anchors and aliases are allowed. A request may match several rules; all of
// them apply, and they are reported in file order.
//
// Subjects: a rule's subject is its "*" keys' values, in sorted key order,
// as "k=v,k2=v2". In keys and values the bytes '%', ',', '=', '{', '}' and
// control bytes are written as %XX (hex), so distinct descriptors never share
// a bucket and a subject never contains a Redis hash tag. A rule without "*"
// keys has one bucket for all matching requests.
//
// Reloading: the agent checks the file every second (and at once on SIGHUP)
// and loads it when its content changed. This follows Kubernetes ConfigMap
// updates (symlink swaps) and editors that write by renaming. An invalid
// file is logged with every problem and the rules in force stay; the
// rules_version (the first 16 hex digits of the file's SHA-256) in logs and
// metrics says which file is in force.
//
// Files: rule.go (a rule, its fields and the limits on a file), parse.go
// (Load, Parse and validation, every problem located), auto.go (a mode
// auto rule's auto block), set.go (one version of the file), match.go
// (a request's descriptors to rules and subjects), watcher.go (reloading
// on change or SIGHUP), errors.go (sentinel errors and Problem).
package rules
