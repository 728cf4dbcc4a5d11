// Package admission owns the evidence for both halves of Ration's promise
// (never more than B + r*T, and everything up to it): the admission log
// (the format agents write under -record: AppendLine, Read), a Recorder
// for in-process tests, and two judges over it. The first replays
// admissions through a leaky bucket to find the largest overshoot over
// every window, not just the total; the second (Refusals) counts false
// refusals, requests refused that an exact bucket fed the same admitted
// history would have admitted. It judges admission control; it is not
// one.
//
// For a quota (B, r), admitted cost over any interval [t0, t1] must be at
// most B + r*(t1 - t0). Replaying admissions as level = max(0, level -
// r*dt) + cost, that holds for every window exactly when max(level) <= B;
// max(level) - B is the largest overshoot in tokens. Check counts a
// repeated admitted request id once (a retry answered from the store's
// record) and the overshoot that holds wherever in [At - Latency, At]
// each charge really happened (CertainOvershoot: each window widened by
// its own admissions' latencies only); Judge passes a report whose
// certain overshoot is within its bound. cmd/ration-check runs it over
// log files.
//
// Files: admission.go (Record, the Recorder, Check, Judge and the
// overshoot report), window.go (the certain overshoot: each charge
// anywhere in its latency), refusal.go (the second judge), log.go (the
// log format).
package admission
