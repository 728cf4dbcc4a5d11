#!/usr/bin/env bash
# What the sidecar adds to a request under real load, not at saturation:
# for each call kind (the empty call, unary Allow on a redis rule with
# 10,000 keys, unary Allow on a leased rule, Envoy's ShouldRateLimit on
# the redis rule, HTTP GET /v1/check on the redis rule) its capacity is
# measured first (closed loop, CONC callers, CAP_DURATION), then it is
# driven open loop (latency from the intended send time) at 25, 50 and 75 %
# of THAT capacity, each run next to the empty call (gRPC health check) at
# the same absolute rate, so every row has its floor at the same offered
# load. ROUNDS rounds (each measures the capacities again), the kind and
# its empty reference alternating which goes first. Prints markdown
# tables: the capacities, then the medians over the rounds of p50, p99 and
# p99.9, the empty call's, and the difference (what the call adds over the
# floor), with the rounds that fell behind their schedule (saturated).
#
# One redis-server, one one-node coordinator (-dev) and one gateway-agent
# of its own, pinned to CPU 0 (taskset -c 0); ration-bench pinned to CPU 1.
#
#   scripts/bench-latency.sh                   # ROUNDS=3 DURATION=3s: about 7 minutes (ROUNDS=2: under 5)
#   ROUNDS=1 DURATION=2s CAP_DURATION=2s scripts/bench-latency.sh   # a quick look
#   KEEP=/tmp/runs scripts/bench-latency.sh    # KEEP: copy every run's JSON there
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3s}         # each open-loop run, measured
CAP_DURATION=${CAP_DURATION:-2s} # each capacity run, measured
WARMUP=${WARMUP:-1s}
CONC=${CONC:-64}
LOADS=${LOADS:-25 50 75} # percent of the kind's capacity
MAX_OUT=${MAX_OUT:-256}  # open loop: most calls in flight
GO=${GO:-go}
work=$(mktemp -d)
procs=()
die() { echo "bench-latency: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }
cleanup() {
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/*.json "$KEEP"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
for cmd in redis-server redis-cli jq curl taskset "$GO"; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done
pin_server="taskset -c 0"
pin_load="taskset -c 1"
[ "$(nproc)" -ge 2 ] || { pin_server=""; pin_load=""; say "one CPU: not pinned"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(loadavg)
started=$(date -u +%H:%M)

for b in gateway-agent coordinator ration-bench; do "$GO" build -o "$work/$b" "./cmd/$b"; done

# shellcheck source=scripts/lib/redis.sh
. scripts/lib/redis.sh
start_redis
[ -z "$pin_server" ] || taskset -pc 0 "$rpid" >/dev/null

cat >"$work/rules.yaml" <<'YAML'
rules:
  # The Redis path: every decision one script call; admitted (a large
  # burst and rate per user), so every answer does the same work.
  - name: bench
    match: {user: "*"}
    burst: 1000000
    rate: 1000000
    on_failure: fail_closed
  # Leased: decided in the agent's memory from a slice leased from the
  # coordinator, far above what is asked here.
  - name: leased
    match: {leased: "*"}
    burst: 1000000000
    rate: 1000000000
    mode: leased
    on_failure: fail_closed
    lease: {period: 10s}
YAML
$pin_server "$work/coordinator" -dev -rules "$work/rules.yaml" -raft 127.0.0.1:0 -grpc 127.0.0.1:0 -http 127.0.0.1:0 \
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

$pin_server "$work/gateway-agent" -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" -coordinators "$COORD" \
  -insecure -grpc 127.0.0.1:0 -http 127.0.0.1:0 -id bench-latency 2>"$work/agent.log" &
apid=$!
procs+=("$apid")
for _ in $(seq 100); do
  grep -q 'store answered: ready' "$work/agent.log" 2>/dev/null && break
  kill -0 "$apid" 2>/dev/null || { cat "$work/agent.log" >&2; die "gateway-agent exited"; }
  sleep 0.1
done
GRPC=$(sed -n 's/.*gateway-agent started.* grpc=\([^ ]*\).*/\1/p' "$work/agent.log" | head -1)
HTTP=$(sed -n 's/.*gateway-agent started.* http=\([^ ]*\).*/\1/p' "$work/agent.log" | head -1)
[ -n "$GRPC" ] && [ -n "$HTTP" ] || { cat "$work/agent.log" >&2; die "no addresses in the agent's log"; }
for _ in $(seq 100); do curl -sf -o /dev/null "http://$HTTP/readyz" && break; sleep 0.1; done
say "gateway-agent $apid on grpc $GRPC http $HTTP, redis-server $rpid, coordinator $cpid, $(git rev-parse --short HEAD)"

# name|label|flags: the call kinds, the empty call first (the reference).
kinds=(
  "empty|empty call (gRPC health check)|-mode empty -target $GRPC"
  "allow|Allow, Redis path, 10,000 keys|-mode allow -target $GRPC -keys 10000 -dist uniform"
  "leased|Allow, leased, 1 key|-mode allow -target $GRPC -descriptor-key leased -key-prefix u -dist hot"
  "envoy|Envoy RLS, Redis path, 10,000 keys|-mode envoy -target $GRPC -keys 10000 -dist uniform"
  "http|HTTP /v1/check, Redis path, 10,000 keys|-mode http -http-target $HTTP -keys 10000 -dist uniform"
)
field() { local IFS='|'; read -r -a f <<<"$1"; echo "${f[$2]}"; }

# bench OUT FLAGS...: one ration-bench run, its JSON kept as OUT.json.
bench() {
  local out=$1
  shift
  # shellcheck disable=SC2086 # pin_load: words or nothing
  $pin_load "$work/ration-bench" -warmup "$WARMUP" -timeout 2s -pids "$apid,$rpid" -json "$@" >"$work/$out.json"
}

# openloop OUT FLAGS...: one open-loop run of DURATION at $rate.
openloop() {
  local out=$1
  shift
  bench "$out" "$@" -rate "$rate" -max-outstanding "$MAX_OUT" -duration "$DURATION"
}
# Each round measures each kind's capacity again just before its open-loop
# runs: on a shared machine what the agent can do moves with the other
# work, and a capacity from minutes earlier can put "75 %" past saturation.
for i in $(seq "$ROUNDS"); do
  for k in "${kinds[@]}"; do
    name=$(field "$k" 0)
    # shellcheck disable=SC2046 # the kind's flags: words
    bench "cap-$name-r$i" $(field "$k" 2) -concurrency "$CONC" -duration "$CAP_DURATION"
    cap=$(jq '.decisions_per_s | floor' "$work/cap-$name-r$i.json")
    for pct in $LOADS; do
      rate=$((cap * pct / 100))
      say "round $i of $ROUNDS: $name, capacity $cap/s, at $pct% ($rate/s)"
      # shellcheck disable=SC2046 # the kinds' flags: words
      if [ "$name" = empty ]; then
        openloop "o-$name-$pct-r$i" $(field "$k" 2)
      elif [ $((i % 2)) = 1 ]; then
        openloop "o-$name-$pct-r$i" $(field "$k" 2)
        openloop "e-$name-$pct-r$i" $(field "${kinds[0]}" 2)
      else
        openloop "e-$name-$pct-r$i" $(field "${kinds[0]}" 2)
        openloop "o-$name-$pct-r$i" $(field "$k" 2)
      fi
    done
  done
done

jqdefs='def med: sort | if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end;
  def n: if . >= 1000 then (. | floor | tostring | [scan("\\d")] | reverse | [_nwise(3)] | map(reverse | add) | reverse | join(",")) else (. * 10 | round / 10 | tostring) end;
  def q(f): map(.latency_us | f) | med;
  def kept: .latency_us.count > 0 and .open_loop.unsent <= 0.01 * .rate * .duration_s;'

echo "Capacities (closed loop, $CONC callers, $CAP_DURATION measured after $WARMUP; median of $ROUNDS round(s), and the range):"
echo
echo "| call | decisions/s | range | p50 µs | p99 µs | agent CPU µs/decision | errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for k in "${kinds[@]}"; do
  name=$(field "$k" 0)
  jq -rs --arg what "$(field "$k" 1)" "$jqdefs"'
    "| \($what) | \(map(.decisions_per_s)|med|n) | \(map(.decisions_per_s)|min|n)-\(map(.decisions_per_s)|max|n) | \(q(.p50)|n) | \(q(.p99)|n) | \(map(.cpu[0].us_per_decision)|med|n) | \(map(.errors)|add) |"' \
    "$work"/cap-"$name"-r*.json
done
echo
echo "Open loop, $DURATION (after $WARMUP) per run, µs: medians over the rounds where both the call's run and the empty"
echo "call's run at the same rate kept up (\"rounds\": those kept of $ROUNDS; a run that fell behind, more than 1 % of"
echo "the calls due never started, measured a stall, not the call). \"added\": the call's minus the empty call's."
echo
echo "| call | load | rate/s | p50 | p99 | p99.9 | empty p50 | empty p99 | empty p99.9 | added p50 | added p99 | added p99.9 | rounds | errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for k in "${kinds[@]}"; do
  name=$(field "$k" 0)
  for pct in $LOADS; do
    o=("$work"/o-"$name"-"$pct"-r*.json)
    if [ "$name" = empty ]; then e=("${o[@]}"); else e=("$work"/e-"$name"-"$pct"-r*.json); fi
    jq -rn --arg what "$(field "$k" 1)" --arg pct "$pct" --arg self "$([ "$name" = empty ] && echo 1)" \
      --slurpfile o <(cat "${o[@]}") --slurpfile e <(cat "${e[@]}") "$jqdefs"'
      [range(0; $o | length) | select(($o[.] | kept) and ($e[.] | kept))] as $idx |
      [$idx[] | $o[.]] as $O | [$idx[] | $e[.]] as $E |
      def d(x): if $self == "1" or ($idx | length) == 0 then "-" else (x | if . < 0 then "-" + (-. | n) else n end) end;
      def v(x): if ($idx | length) == 0 then "-" else (x | n) end;
      "| \($what) | \($pct)% | \($o | map(.rate) | med | n) | \(v($O | q(.p50))) | \(v($O | q(.p99))) | \(v($O | q(.p99_9))) | \(v($E | q(.p50))) | \(v($E | q(.p99))) | \(v($E | q(.p99_9))) | \(d(($O | q(.p50)) - ($E | q(.p50)))) | \(d(($O | q(.p99)) - ($E | q(.p99)))) | \(d(($O | q(.p99_9)) - ($E | q(.p99_9)))) | \($idx | length) of \($o | length) | \($o + $e | map(.errors) | add) |"'
  done
done
echo
echo "Measured at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- cmd internal scripts || echo ' (with uncommitted changes)'), $started-$(date -u +%H:%M) UTC, load average $load_start at the start, $(loadavg) at the end."
