// Package admission owns the evidence for Ration's overshoot bounds: a
// recorder of admitted requests (monotonic time, quota, cost) and a checker
// that replays them through a leaky bucket to find the largest overshoot
// over every window, not just the total.
//
// For a quota (B, r), admitted cost over any interval [t0, t1] must be at
// most B + r*(t1 - t0). Replaying admissions as level = max(0, level -
// r*dt) + cost, that holds for every window exactly when max(level) <= B;
// max(level) - B is the largest overshoot in tokens.
package admission
