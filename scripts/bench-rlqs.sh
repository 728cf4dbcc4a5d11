#!/usr/bin/env bash
# Envoy on RLQS against Envoy on RLS v3, at the same offered load, on one
# gateway-agent: the agent's CPU per decision. RLS: every request is a
# ShouldRateLimit call (ghz, open loop at RATE calls/s, 32 callers on 4
# connections). RLQS: CLIENTS filter-like streams (test/rlqsload, the
# client of internal/harness) decide every request themselves on the token
# bucket assignments the agent lends them, together at RATE requests/s,
# each reporting every second. Both on one leased rule and one subject, so
# RLS decides on the lease in the agent (no Redis round trip) and RLQS
# assignments are lent from the same lease. The agent is pinned to CPU 0,
# the load to CPU 1; ROUNDS interleaved rounds of DURATION each, plus an
# idle round (no load) for the agent's own background CPU. Prints a
# markdown table of the medians over the rounds: decisions/s and the
# agent's CPU per decision (from /proc, 10ms ticks), and the ratio.
#
#   scripts/bench-rlqs.sh        # ROUNDS=3 DURATION=15s RATE=2000 CLIENTS=16
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-15s}
RATE=${RATE:-2000}
CLIENTS=${CLIENTS:-16}
GO=${GO:-go}
work=$(mktemp -d)
procs=()
die() { echo "bench-rlqs: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }
cleanup() {
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] && cp -r "$work" "$KEEP"; rm -rf "$work"
}
trap cleanup EXIT
for cmd in redis-server redis-cli jq taskset curl "$GO"; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done
GHZ=$(command -v ghz || echo "$($GO env GOPATH)/bin/ghz")
[ -x "$GHZ" ] || "$GO" install github.com/bojand/ghz/cmd/ghz@v0.121.0
pin_server="taskset -c 0"
pin_load="taskset -c 1"
[ "$(nproc)" -ge 2 ] || { pin_server=""; pin_load=""; say "one CPU: not pinned"; }
for b in gateway-agent coordinator ration-bench; do "$GO" build -o "$work/$b" "./cmd/$b"; done
"$GO" test -c -o "$work/rlqsload.test" ./test/rlqsload
"$work/ration-bench" protoset "$work/agent.protoset" >/dev/null

# The rule is far above the offered load: the measurement is the cost of
# deciding, not of denying.
cat >"$work/rules.yaml" <<'YAML'
rules:
  - name: bench
    match: {domain: ration-bench, user: "*"}
    burst: 100000
    rate: 100000
    mode: leased
    on_failure: fail_closed
    lease: {period: 10s}
YAML
# shellcheck source=scripts/lib/redis.sh
. scripts/lib/redis.sh
start_redis
# shellcheck source=scripts/lib/servers.sh
. scripts/lib/servers.sh
start_coordinator "$work/rules.yaml" $pin_load
AGENT_PREFIX=$pin_server start_agent agent.log -- -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" \
  -coordinators "$COORD" -insecure -id bench-rlqs
say "gateway-agent pid $apid on $GRPC, coordinator $COORD, $(git rev-parse --short HEAD), load average $(cut -d' ' -f1-3 /proc/loadavg)"

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
secs=$(echo "$DURATION" | sed 's/s$//')
# measure NAME CMD...: runs CMD, then writes NAME.json: the decisions CMD
# reported in $work/NAME.out ({decisions, seconds}) and the agent's CPU
# over the run, in µs.
measure() {
  local name=$1 a0 a1
  shift
  a0=$(ticks "$apid")
  "$@"
  a1=$(ticks "$apid")
  jq --argjson a "$(((a1 - a0) * 1000000 / hz))" '. + {agent_us: $a}' "$work/$name.out" >"$work/$name.json"
}
idle() { sleep "$secs"; echo "{\"decisions\": 0, \"seconds\": $secs}" >"$work/$1.out"; }
rls() {
  $pin_load "$GHZ" --insecure --protoset "$work/agent.protoset" \
    --call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit \
    -d '{"domain":"ration-bench","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}' \
    --rps "$RATE" -c 32 --connections 4 -z "$DURATION" --format json "$GRPC" >"$work/$1.raw"
  jq '{decisions: (.statusCodeDistribution.OK // 0), seconds: (.total / 1e9), notok: ([.statusCodeDistribution | to_entries[] | select(.key != "OK") | .value] | add // 0)}' \
    "$work/$1.raw" >"$work/$1.out"
}
rlqs() {
  RATION_RLQS_TARGET=$GRPC RATION_RLQS_CLIENTS=$CLIENTS RATION_RLQS_RATE=$RATE RATION_RLQS_DURATION=$DURATION \
    RATION_RLQS_DOMAIN=ration-bench RATION_RLQS_OUT="$work/$1.out" \
    $pin_load "$work/rlqsload.test" -test.run '^TestRLQSLoad$' -test.count=1 >"$work/$1.log" 2>&1 ||
    { cat "$work/$1.log" >&2; die "rlqs load failed"; }
}
# A first RLQS run warms the lease and the streams' assignments up.
RATION_RLQS_DURATION=3s rlqs warm
for i in $(seq "$ROUNDS"); do
  say "round $i of $ROUNDS (load average $(cut -d' ' -f1 /proc/loadavg))"
  measure "idle-$i" idle "idle-$i"
  measure "rls-$i" rls "rls-$i"
  measure "rlqs-$i" rlqs "rlqs-$i"
done
med() { jq -s "map($1) | sort | .[length/2|floor]" "$work"/"$2"-*.json; }
echo "| $RATE requests/s offered, ${DURATION} x $ROUNDS rounds | decisions/s | agent CPU ms/s | agent CPU µs/decision | not OK (all rounds) |"
echo "| --- | --- | --- | --- | --- |"
echo "| idle (no load) | 0 | $(med '.agent_us / .seconds / 1000 * 10 | floor / 10' idle) | - | - |"
echo "| RLS v3 ShouldRateLimit, one call per request (ghz, 32 callers) | $(med '.decisions / .seconds | floor' rls) | $(med '.agent_us / .seconds / 1000 * 10 | floor / 10' rls) | $(med '.agent_us / .decisions * 100 | floor / 100' rls) | $(jq -s 'map(.notok) | add' "$work"/rls-*.json) |"
echo "| RLQS, $CLIENTS streams deciding locally, one report per stream per second | $(med '.decisions / .seconds | floor' rlqs) | $(med '.agent_us / .seconds / 1000 * 10 | floor / 10' rlqs) | $(med '.agent_us / .decisions * 100 | floor / 100' rlqs) | 0 |"
r=$(med '.agent_us / .decisions' rls); q=$(med '.agent_us / .decisions' rlqs)
echo
if [ "$(jq -n "$q > 0")" = true ]; then
  echo "RLS / RLQS: agent CPU per decision $(jq -n "$r / $q * 10 | floor / 10")x"
else
  echo "RLS / RLQS: the agent used no measurable CPU (under one 10ms tick) in the median RLQS round: ratio > $(jq -n "$r * ($secs * $RATE) / (1000000 / $hz) | floor")x"
fi
