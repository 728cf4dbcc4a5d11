// Package harness starts the real processes Ration's tests run against:
// redis-server primaries, replicas, Sentinels and Clusters (redis*.go), each
// on free loopback ports in its own temporary directory, stopped by
// t.Cleanup, with its log dumped when the test fails. Raft cluster helpers
// live in their own files (hierarchy.go: a global group and regional
// groups leasing from it through proxies); StartAgentProcess
// (agentproc.go) runs a gateway-agent as a process of its own, which a
// test can pause whole (SIGSTOP) and resume. NewProxy (proxy.go) puts a
// faulty link in front of any of them: stalled, blackholed, delayed,
// slowed to a byte rate, reset or moved to another upstream.
// DialRLQS (rlqsclient.go) is an Envoy on RLQS: a client that decides
// every request itself on the assignments an agent sends it, as Envoy's
// rate_limit_quota filter does.
//
// It is imported only by _test.go files and by test/chaos. Everything is
// parallel-safe: no package globals, every helper takes the testing.TB that
// owns what it starts. A missing binary fails the test (never skips it) with
// the Debian package that provides it.
package harness
