// Package admission owns the evidence for Ration's overshoot bounds: the
// admission log (the format agents write under -record: AppendLine, Read),
// a Recorder for in-process tests, and a checker that replays admissions
// through a leaky bucket to find the largest overshoot over every window,
// not just the total.
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
package admission
