// Command coordinator-launch starts a coordinator in a Kubernetes
// StatefulSet pod, choosing between -bootstrap and -join from the pod's
// ordinal, which the coordinator itself cannot see and a container without
// a shell cannot compute:
//
//	coordinator-launch /coordinator [coordinator flags...]
//
// It reads two environment variables and then replaces itself with the
// coordinator (execve), passing the arguments and the rest of the
// environment through unchanged:
//
//   - POD_NAME: the pod's name (downward API metadata.name), ending in
//     "-ORDINAL".
//   - RATION_JOIN: host:port of the ready members' admin API (their
//     -admin port, 8303), a headless Service that lists only ready pods
//     (no publishNotReadyAddresses). The coordinator reads it too.
//
// The rule:
//
//   - Ordinal above 0: run unchanged; the coordinator joins through
//     RATION_JOIN (it ignores -join once it has Raft state).
//   - Ordinal 0 and RATION_JOIN's host resolves to at least one address:
//     a member is ready, so a cluster exists (coordinator-0 lost its disk):
//     run unchanged, so it joins instead of forming a second cluster.
//   - Ordinal 0 and the host does not exist (no ready member anywhere):
//     run with RATION_BOOTSTRAP=true and without RATION_JOIN. A node that
//     already has Raft state ignores -bootstrap, so restarts are harmless.
//   - Any other lookup error: exit 2 without starting. Doubt never
//     bootstraps: a second cluster would hand out the same budget twice.
//
// It must stay free of dependencies beyond the standard library: the
// Dockerfile builds it from the repository's root module.
package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: coordinator-launch /path/to/coordinator [flags...] (env POD_NAME, RATION_JOIN)")
		os.Exit(2)
	}
	env, err := decide(os.Args[2:], os.Environ(), net.LookupHost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordinator-launch:", err)
		os.Exit(2)
	}
	err = syscall.Exec(os.Args[1], os.Args[1:], env)
	fmt.Fprintf(os.Stderr, "coordinator-launch: exec %s: %v\n", os.Args[1], err)
	os.Exit(2)
}

// decide returns the coordinator's environment. lookup is net.LookupHost
// outside tests.
func decide(args, env []string, lookup func(string) ([]string, error)) ([]string, error) {
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "bootstrap" || name == "join") {
			return nil, fmt.Errorf("argument %q: -bootstrap and -join are chosen by the launcher; remove it", a)
		}
	}
	get := func(k string) (string, bool) {
		for _, kv := range slices.Backward(env) {
			if name, v, ok := strings.Cut(kv, "="); ok && name == k {
				return v, true
			}
		}
		return "", false
	}
	if _, ok := get("RATION_BOOTSTRAP"); ok {
		return nil, errors.New("RATION_BOOTSTRAP is set: the launcher chooses it; remove it")
	}
	pod, _ := get("POD_NAME")
	ordinal, err := podOrdinal(pod)
	if err != nil {
		return nil, err
	}
	join, _ := get("RATION_JOIN")
	if join == "" {
		return nil, errors.New("RATION_JOIN is empty: set it to the ready members' Service, host:port")
	}
	if ordinal > 0 {
		fmt.Fprintf(os.Stderr, "coordinator-launch: %s: ordinal %d: joining through %s (ignored if this node has Raft state)\n", pod, ordinal, join)
		return env, nil
	}
	host, _, err := net.SplitHostPort(join)
	if err != nil {
		return nil, fmt.Errorf("RATION_JOIN %q: %w", join, err)
	}
	addrs, err := lookup(host)
	var dnsErr *net.DNSError
	switch {
	case err == nil && len(addrs) > 0:
		fmt.Fprintf(os.Stderr, "coordinator-launch: %s: ordinal 0, ready members exist (%s): joining\n", pod, strings.Join(addrs, ","))
		return env, nil
	case err == nil, errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		fmt.Fprintf(os.Stderr, "coordinator-launch: %s: ordinal 0, no ready member behind %s: bootstrap (ignored if this node has Raft state)\n", pod, host)
		out := make([]string, 0, len(env)+1)
		for _, kv := range env {
			if !strings.HasPrefix(kv, "RATION_JOIN=") {
				out = append(out, kv)
			}
		}
		return append(out, "RATION_BOOTSTRAP=true"), nil
	default:
		return nil, fmt.Errorf("ordinal 0: cannot tell whether a cluster exists (lookup %s: %w); not bootstrapping", host, err)
	}
}

// podOrdinal reads the ordinal a StatefulSet puts at the end of a pod name.
func podOrdinal(pod string) (int, error) {
	i := strings.LastIndexByte(pod, '-')
	if i < 0 {
		return 0, fmt.Errorf("POD_NAME %q: want NAME-ORDINAL (a StatefulSet pod name, from the downward API)", pod)
	}
	n, err := strconv.Atoi(pod[i+1:])
	if err != nil || n < 0 || pod[i+1:] != strconv.Itoa(n) {
		return 0, fmt.Errorf("POD_NAME %q: want NAME-ORDINAL (a StatefulSet pod name, from the downward API)", pod)
	}
	return n, nil
}
