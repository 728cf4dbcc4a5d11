// Package chaos proves Ration's overshoot bounds under real faults: real
// gateway-agent, coordinator and redis-server processes on loopback, an
// in-process TCP fault proxy (internal/harness.Proxy) and a gRPC reply
// dropper between them, open-loop load at three times each quota's rate,
// and a checker (internal/admission) over every decision the agents
// recorded with -record.
//
// Each scenario is a test (TestS0..., named after the table in
// docs/reliability.md) that asserts its measured overshoot against its
// stated bound and adds a row to the table printed at the end of the run.
//
//	go test ./test/chaos/                   # every scenario (make test runs it under -race)
//	RATION_SOAK=10m go test -run TestSoak -v ./test/chaos/ # the soak (make soak)
//	RATION_CHAOS_SEED=N                     # replay a run's random choices
//	RATION_CHAOS_BREAK=S0,S10               # remove a scenario's protection: it must fail
//	                                        # (S19, S20: the binaries built with codeBreaks' edits)
//	RATION_CHAOS_REPORT=docs/reliability.md # write the table there (absolute path)
//
// Everything a test starts is stopped in t.Cleanup: processes get SIGKILL
// (and die with the test binary, via Pdeathsig, if it is killed).
package chaos
