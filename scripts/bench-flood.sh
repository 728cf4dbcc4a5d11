#!/usr/bin/env bash
# One subject flooding a mode: redis rule (burst 100, 100/s) at RATE
# requests/s (default 2,000: 20x its rate) with at most 64 in flight, with
# the agent's local denials on (-local-denials 8192, the default) and off
# (0), in one run: script calls Redis ran for the subject, admissions
# against B + r T (utilisation), latency and CPU per decision. Each
# setting gets its own redis-server and gateway-agent; the load is
# ration-bench (open loop), then ghz (a third-party gRPC load tool,
# installed from the Go module proxy when missing) at the same rate. Then a
# closed loop of 64 callers on the flooding subject, beside a leased rule
# of one key, for the agent's CPU per denied decision against a leased one.
#
#   scripts/bench-flood.sh             # RATE=2000 DURATION=10s
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-2000}
DURATION=${DURATION:-10s}
GO=${GO:-go}
work=$(mktemp -d)
procs=()
die() { echo "bench-flood: $*" >&2; exit 1; }
say() { echo "== $*" >&2; }
cleanup() {
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for cmd in redis-server redis-cli jq curl "$GO"; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done
GHZ=$(command -v ghz || echo "$($GO env GOPATH)/bin/ghz")
[ -x "$GHZ" ] || "$GO" install github.com/bojand/ghz/cmd/ghz@v0.121.0
for b in gateway-agent coordinator ration-bench; do "$GO" build -o "$work/$b" "./cmd/$b"; done
cat >"$work/rules.yaml" <<'YAML'
rules:
  - name: flood
    match: {user: "*"}
    burst: 100
    rate: 100
  - name: leased-hot
    match: {hot: "*"}
    mode: leased
    burst: 1000000000
    rate: 1000000000
YAML
# shellcheck source=scripts/lib/servers.sh
. scripts/lib/servers.sh
start_coordinator "$work/rules.yaml"

# shellcheck source=scripts/lib/redis.sh
. scripts/lib/redis.sh
calls() { redis-cli -p "$redis_port" info commandstats | awk -F'[=,:]' '/cmdstat_eval/ {s+=$3} END {print s+0}'; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

for ld in 8192 0; do
  start_redis
  start_agent "agent-$ld.log" -- -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" -coordinators "$COORD" -insecure \
    -id "flood-$ld" -local-denials "$ld"
  say "-local-denials $ld: agent $apid on $GRPC, redis-server $rpid, $(git rev-parse --short HEAD)"
  c0=$(calls)
  "$work/ration-bench" -target "$GRPC" -mode allow -rule flood -dist hot -keys 1 -rate "$RATE" -max-outstanding 64 \
    -duration "$DURATION" -warmup 0s -pids "$apid,$rpid" -json >"$work/bench-$ld.json"
  c1=$(calls)
  jq -r --arg ld "$ld" --arg calls "$((c1 - c0))" '
    "| ration-bench | \($ld) | \(.decisions) | \(.allowed) | \($calls) | \(.latency_us.p50) | \(.latency_us.p99) | \(.cpu[0].us_per_decision) | \(.cpu[1].us_per_decision) |"' \
    "$work/bench-$ld.json"
  allowed() { curl -s "http://$HTTP/metrics" | awk '/^ration_decisions_total\{.*result="allowed".*rule="flood"/ {s+=$2} END {print s+0}'; }
  a0=$(ticks "$apid"); r0=$(ticks "$rpid"); c0=$(calls); n0=$(allowed)
  "$GHZ" --insecure --proto proto/ration/v1/ratelimiter.proto --import-paths proto --call ration.v1.RateLimiter/Allow \
    -d '{"descriptors":{"user":"g0"}}' --rps "$RATE" -c 64 -z "$DURATION" --format json "$GRPC" >"$work/ghz-$ld.json"
  a1=$(ticks "$apid"); r1=$(ticks "$rpid"); c1=$(calls)
  jq -r --arg ld "$ld" --arg calls "$((c1 - c0))" --arg a "$(((a1 - a0) * 1000000 / hz))" --arg r "$(((r1 - r0) * 1000000 / hz))" --arg allowed "$(($(allowed) - n0))" '
    "| ghz | \($ld) | \(.count) | \($allowed) | \($calls) | \(.latencyDistribution[] | select(.percentage == 50) | .latency / 1000 | floor) | \(.latencyDistribution[] | select(.percentage == 99) | .latency / 1000 | floor) | \(($a | tonumber) / .count * 10 | floor / 10) | \(($r | tonumber) / .count * 10 | floor / 10) |"' \
    "$work/ghz-$ld.json"
  if [ "$ld" != 0 ]; then
    for rule in flood leased-hot; do
      "$work/ration-bench" -target "$GRPC" -mode allow -rule "$rule" -dist hot -keys 1 -concurrency 64 \
        -duration "$DURATION" -pids "$apid" -json >"$work/closed-$rule.json"
      jq -r --arg rule "$rule" '"closed loop, 64 callers, rule \($rule): \(.decisions_per_s | floor)/s, agent \(.cpu[0].us_per_decision) µs/decision"' "$work/closed-$rule.json"
    done
  fi
  kill "$apid" "$rpid"; wait "$apid" "$rpid" 2>/dev/null || true
done
