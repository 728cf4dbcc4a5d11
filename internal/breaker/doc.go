// Package breaker owns the circuit breaker that stops the agent from waiting
// on a dependency (Redis, the coordinators) that is known to be down.
//
// Closed: calls go through; Threshold consecutive failures open it. Open:
// calls are refused at once (the caller applies its failure policy without
// waiting); a prober calls Probe no more often than ProbeInterval, and one
// success closes the breaker. Time is passed in, so tests control it.
package breaker
