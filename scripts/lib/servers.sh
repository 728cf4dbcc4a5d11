# Sourced by the bench scripts: a one-node coordinator group and a
# gateway-agent of their own, on loopback ports the kernel picks (port 0),
# their addresses read from their start-up log lines. The caller defines
# die, work and the procs array, and has built the binaries into $work.

# start_coordinator RULES [PREFIX...]: a -dev node with the rules file;
# sets cpid and COORD (its lease gRPC address). PREFIX is run before the
# binary (e.g. taskset -c 0).
start_coordinator() {
  local rules=$1
  shift
  "$@" "$work/coordinator" -dev -rules "$rules" -raft 127.0.0.1:0 -grpc 127.0.0.1:0 -http 127.0.0.1:0 \
    -admin 127.0.0.1:0 -data-dir "$work/raft" 2>"$work/coordinator.log" &
  cpid=$!
  procs+=("$cpid")
  for _ in $(seq 100); do
    grep -q 'leader ready' "$work/coordinator.log" 2>/dev/null && break
    kill -0 "$cpid" 2>/dev/null || { cat "$work/coordinator.log" >&2; die "coordinator exited"; }
    sleep 0.1
  done
  COORD=$(sed -n 's/.*coordinator started.* grpc_addr=\([^ ]*\).*/\1/p' "$work/coordinator.log" | head -1)
  [ -n "$COORD" ] || { cat "$work/coordinator.log" >&2; die "coordinator not ready"; }
}

# start_agent LOG -- AGENT_FLAGS... : a gateway-agent with AGENT_FLAGS (and
# its listeners on port 0), its log in $work/LOG; once /readyz answers 200,
# sets apid, GRPC and HTTP. AGENT_PREFIX (e.g. taskset -c 0) runs before it.
start_agent() {
  local log=$work/$1
  shift 2
  # shellcheck disable=SC2086 # AGENT_PREFIX: words or nothing
  ${AGENT_PREFIX:-} "$work/gateway-agent" "$@" -grpc 127.0.0.1:0 -http 127.0.0.1:0 2>"$log" &
  apid=$!
  procs+=("$apid")
  for _ in $(seq 100); do
    grep -q 'gateway-agent started' "$log" 2>/dev/null && break
    kill -0 "$apid" 2>/dev/null || { cat "$log" >&2; die "gateway-agent exited"; }
    sleep 0.1
  done
  GRPC=$(sed -n 's/.*gateway-agent started.* grpc=\([^ ]*\).*/\1/p' "$log" | head -1)
  HTTP=$(sed -n 's/.*gateway-agent started.* http=\([^ ]*\).*/\1/p' "$log" | head -1)
  [ -n "$GRPC" ] || { cat "$log" >&2; die "no gRPC address in the agent's log"; }
  for _ in $(seq 100); do curl -sf -o /dev/null "http://$HTTP/readyz" && return; sleep 0.1; done
  cat "$log" >&2
  die "gateway-agent not ready"
}
