#!/usr/bin/env bash
# Envoy's ShouldRateLimit against Allow and the empty call, measured by
# ghz (a third-party gRPC load tool, installed from the Go module proxy
# when missing) on one gateway-agent: the agent and its redis-server pinned
# to CPU 0, ghz to CPU 1, ROUNDS interleaved rounds of DURATION each, 64
# concurrent callers on 4 connections, the same mode: redis rule and
# 10,000 keys for Allow and RLS. Prints a markdown table of the medians
# over the rounds: decisions/s, p50, p99, and the agent's and
# redis-server's CPU per decision (from /proc), the calls not answered OK
# (a decision past -decision-timeout on a loaded machine answers
# UNAVAILABLE), and the RLS / Allow ratios. ghz's own CPU per call says
# whether the tool, on its one core, is what limits decisions/s (it builds
# each request from its JSON template through protobuf's reflection, and
# RLS's nested message costs it more than Allow's).
#
# RATE=N offers N calls/s of each kind (ghz --rps) instead of as many as
# 64 callers make: the agent's CPU per decision compared at the same
# offered load, below the rate at which ghz itself saturates its core.
#
#   scripts/bench-rls.sh               # ROUNDS=5 DURATION=5s
#   RATE=2000 scripts/bench-rls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
RATE=${RATE:-0}
GO=${GO:-go}
work=$(mktemp -d)
procs=()
die() { echo "bench-rls: $*" >&2; exit 1; }
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
for b in gateway-agent ration-bench; do "$GO" build -o "$work/$b" "./cmd/$b"; done
"$work/ration-bench" protoset "$work/agent.protoset" >/dev/null

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
YAML
# shellcheck source=scripts/lib/servers.sh
. scripts/lib/servers.sh
AGENT_PREFIX=$pin_server start_agent agent.log -- -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" -id bench-rls
say "gateway-agent pid $apid on $GRPC, redis-server pid $rpid, $(git rev-parse --short HEAD)"

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# run NAME CALL DATA: one ghz run; NAME.json is ghz's report with the CPU
# the agent and redis-server used in it, in µs, added.
run() {
  local name=$1 call=$2 data=$3 a0 r0 a1 r1
  a0=$(ticks "$apid"); r0=$(ticks "$rpid")
  /usr/bin/time -f '%U %S' -o "$work/$name.time" $pin_load "$GHZ" --insecure --protoset "$work/agent.protoset" --call "$call" -d "$data" \
    -c 64 --connections 4 --rps "$RATE" -z "$DURATION" --format json "$GRPC" >"$work/$name.raw"
  a1=$(ticks "$apid"); r1=$(ticks "$rpid")
  jq --argjson a "$(((a1 - a0) * 1000000 / hz))" --argjson r "$(((r1 - r0) * 1000000 / hz))" \
    --argjson g "$(awk '{printf "%d", ($1 + $2) * 1000000}' "$work/$name.time")" \
    '. + {agent_us: $a, redis_us: $r, ghz_us: $g}' "$work/$name.raw" >"$work/$name.json"
}
allow='{"descriptors":{"user":"k{{randomInt 0 10000}}"}}'
rls='{"domain":"ration-bench","descriptors":[{"entries":[{"key":"user","value":"k{{randomInt 0 10000}}"}]}]}'
for i in $(seq "$ROUNDS"); do
  say "round $i of $ROUNDS"
  run "empty-$i" grpc.health.v1.Health/Check '{}'
  run "allow-$i" ration.v1.RateLimiter/Allow "$allow"
  run "rls-$i" envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit "$rls"
done
med() { jq -s "map($1) | sort | .[length/2|floor]" "$work"/"$2"-*.json; }
p() { jq -s "map(.latencyDistribution[] | select(.percentage == $1) | .latency / 1000) | sort | .[length/2|floor]" "$work"/"$2"-*.json; }
echo "| call (ghz, 64 callers) | decisions/s | p50 µs | p99 µs | agent CPU µs/decision | redis CPU µs/decision | ghz CPU µs/call | not OK (all rounds) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for kind in empty allow rls; do
  echo "| $kind | $(med '.rps | floor' "$kind") | $(p 50 "$kind") | $(p 99 "$kind") | $(med '.agent_us / .count * 10 | floor / 10' "$kind") | $(med '.redis_us / .count * 10 | floor / 10' "$kind") | $(med '.ghz_us / .count * 10 | floor / 10' "$kind") | $(jq -s 'map(.statusCodeDistribution | to_entries[] | select(.key != "OK") | .value) | add // 0' "$work"/"$kind"-*.json) |"
done
a=$(med '.agent_us / .count' allow); r=$(med '.agent_us / .count' rls)
ra=$(med '.rps' allow); rr=$(med '.rps' rls)
echo
echo "RLS / Allow: agent CPU per decision $(jq -n "$r / $a * 100 | floor / 100"), decisions/s $(jq -n "$rr / $ra * 100 | floor / 100")"
