#!/usr/bin/env bash
# The Go client's Allow from 64 goroutines, unary against coalescing, in
# one run: a redis-server and a gateway-agent of its own pinned to CPU 0,
# ration-bench -mode client (one shared client.Client) pinned to CPU 1,
# ROUNDS interleaved rounds of each, closed loop at CONC callers, then open
# loop at RATE decisions/s (default: 3/4 of the unary rate measured) so the
# latencies compare at the same offered load. Prints a markdown table of
# the medians over the rounds: decisions/s, p50, p99, and the agent's and
# redis-server's CPU per decision (from /proc). CO sets -coalesce for the
# coalescing runs (default 0: the client's default delay).
#
#   scripts/bench-client.sh            # ROUNDS=5 DURATION=5s CONC=64
#   ROUNDS=3 DURATION=3s KEEP=/tmp/runs scripts/bench-client.sh   # KEEP: copy every run's JSON there
#   LEASED=1 scripts/bench-client.sh   # and closed-loop rows on a leased rule (one key), with a coordinator
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
CONC=${CONC:-64}
RATE=${RATE:-}
EXTRA=${EXTRA:-} # more ration-bench flags, e.g. -coalesce-in-flight 4
GO=${GO:-go}
work=$(mktemp -d)
procs=()
die() { echo "bench-client: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }
cleanup() {
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/*.json "$KEEP"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
for cmd in redis-server redis-cli jq taskset "$GO"; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done
pin_server="taskset -c 0"
pin_load="taskset -c 1"
[ "$(nproc)" -ge 2 ] || { pin_server=""; pin_load=""; say "one CPU: not pinned"; }

"$GO" build -o "$work/gateway-agent" ./cmd/gateway-agent
"$GO" build -o "$work/ration-bench" ./cmd/ration-bench

# shellcheck source=scripts/lib/redis.sh
. scripts/lib/redis.sh
start_redis
[ -z "$pin_server" ] || taskset -pc 0 "$rpid" >/dev/null

cat >"$work/rules.yaml" <<'YAML'
rules:
  - name: bench
    match: {user: "*"}
    burst: 1000000
    rate: 1000000
    on_failure: fail_closed
  # Leased (LEASED=1): decided in the agent's memory from a slice leased
  # from a one-node coordinator group, far above what is asked here.
  - name: leased
    match: {leased: "*"}
    burst: 1000000000
    rate: 1000000000
    mode: leased
    on_failure: fail_closed
    lease: {period: 10s}
YAML
coord_flags=()
if [ -n "${LEASED:-}" ]; then
  "$GO" build -o "$work/coordinator" ./cmd/coordinator
  $pin_server "$work/coordinator" -dev -rules "$work/rules.yaml" -raft 127.0.0.1:0 -grpc 127.0.0.1:0 -http 127.0.0.1:0 \
    -admin 127.0.0.1:0 2>"$work/coordinator.log" &
  procs+=("$!")
  for _ in $(seq 100); do
    grep -q 'leader ready' "$work/coordinator.log" 2>/dev/null && break
    sleep 0.1
  done
  COORD=$(sed -n 's/.*coordinator started.* grpc_addr=\([^ ]*\).*/\1/p' "$work/coordinator.log" | head -1)
  [ -n "$COORD" ] || { cat "$work/coordinator.log" >&2; die "coordinator not ready"; }
  coord_flags=(-coordinators "$COORD")
fi
$pin_server "$work/gateway-agent" -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" -insecure \
  "${coord_flags[@]}" -grpc 127.0.0.1:0 -http 127.0.0.1:0 -id bench-client 2>"$work/agent.log" &
apid=$!
procs+=("$apid")
for _ in $(seq 100); do
  grep -q 'store answered: ready' "$work/agent.log" 2>/dev/null && break
  kill -0 "$apid" 2>/dev/null || { cat "$work/agent.log" >&2; die "gateway-agent exited"; }
  sleep 0.1
done
GRPC=$(sed -n 's/.*gateway-agent started.* grpc=\([^ ]*\).*/\1/p' "$work/agent.log" | head -1)
[ -n "$GRPC" ] || { cat "$work/agent.log" >&2; die "no gRPC address in the agent's log"; }
say "gateway-agent pid $apid on $GRPC, redis-server pid $rpid, $(git rev-parse --short HEAD)"

# run NAME COALESCE LOAD...: one ration-bench run, its JSON kept.
run() {
  local name=$1 co=$2
  shift 2
  # shellcheck disable=SC2086 # pin_load and EXTRA: words or nothing
  $pin_load "$work/ration-bench" -mode client -coalesce "$co" -target "$GRPC" -keys 10000 \
    -duration "$DURATION" -warmup "$WARMUP" -timeout 2s -pids "$apid,$rpid" -json $EXTRA "$@" >"$work/$name.json"
}
row() { # row LABEL FILES...: medians over rounds
  local label=$1
  shift
  jq -rs --arg name "$label" '
    def med: sort | .[length/2|floor];
    "| \($name) | \(map(.decisions_per_s)|med|floor) | \(map(.latency_us.p50)|med) | \(map(.latency_us.p99)|med) | \(map(.cpu[0].us_per_decision)|med) | \(map(.cpu[1].us_per_decision)|med) | \(map(.errors)|add) |"' "$@"
}

for i in $(seq "$ROUNDS"); do
  say "closed loop, round $i of $ROUNDS"
  run "unary-c$i" -1ns -concurrency "$CONC"
  run "coalesce-c$i" "${CO:-0}" -concurrency "$CONC"
done
if [ -n "${LEASED:-}" ]; then
  for i in $(seq "$ROUNDS"); do
    say "leased, closed loop, round $i of $ROUNDS"
    run "unary-l$i" -1ns -concurrency "$CONC" -descriptor-key leased -key-prefix u -dist hot
    run "coalesce-l$i" "${CO:-0}" -concurrency "$CONC" -descriptor-key leased -key-prefix u -dist hot
  done
fi
if [ -z "$RATE" ]; then
  RATE=$(jq -s 'map(.decisions_per_s) | sort | .[length/2|floor] * 0.75 | floor' "$work"/unary-c*.json)
fi
for i in $(seq "$ROUNDS"); do
  say "open loop at $RATE/s, round $i of $ROUNDS"
  run "unary-o$i" -1ns -rate "$RATE" -max-outstanding "$CONC"
  run "coalesce-o$i" "${CO:-0}" -rate "$RATE" -max-outstanding "$CONC"
done

echo "| client.Allow, $CONC goroutines, Redis path | decisions/s | p50 µs | p99 µs | agent CPU µs/decision | redis CPU µs/decision | errors |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
row "unary, closed loop" "$work"/unary-c*.json
row "coalescing, closed loop" "$work"/coalesce-c*.json
row "unary, open loop $RATE/s" "$work"/unary-o*.json
row "coalescing, open loop $RATE/s" "$work"/coalesce-o*.json
if [ -n "${LEASED:-}" ]; then
  row "leased (1 key), unary, closed loop" "$work"/unary-l*.json
  row "leased (1 key), coalescing, closed loop" "$work"/coalesce-l*.json
fi
