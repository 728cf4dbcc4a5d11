#!/usr/bin/env bash
# Leased rules against many subjects (docs/leases.md, "Scale with
# subjects"). On loopback only and bounded in time (about 4 minutes with the
# defaults), for each subject count and call mode it starts afresh
#   - a one-node coordinator (its own data dir, -bootstrap) and
#   - one gateway-agent (-coordinators; its own redis-server on a free port,
#     never 6379, which the leased rule never touches but the agent needs)
# with one rule, `match: {user: "*"}`, mode: leased, burst and rate 10^6 per
# subject, fail_closed (so a decision of the failure policy shows as
# "unavailable"), then drives the agent with cmd/ration-bench (uniform
# subjects, closed loop) and prints one markdown table row per run:
# decisions/s, admitted %, % decided by the failure policy (the agent's
# ration_decisions_total{path="fallback"} over the whole run, warmup
# included), latency p50/p99 (per call), the coordinator's RSS at start and
# end, its data dir (Raft log and snapshots) at the end and per 10,000 live
# subjects, and its batching (commands per entry, mean apply time).
#
# Knobs (environment): SCALE_KEYS ("1000 10000 100000"), SCALE_MODES
# ("allow batch"), SCALE_SHARES (the rule's lease.default_share values to
# run, "0 0.5": 0 leases every subject on its own, 0.5 leases half of every
# subject's budget once per rule), SCALE_DURATION (20s), SCALE_WARMUP (1s),
# SCALE_CONCURRENCY (64), SCALE_BATCH (1000), SCALE_COORD_FLAGS (extra
# coordinator flags, e.g. "-snapshot-interval 5s -snapshot-threshold 256"),
# SCALE_BIN (a directory holding coordinator, gateway-agent and
# ration-bench already built; default: build them from this tree),
# SCALE_KEEP=1 keeps the work directory (JSON reports, logs, metrics and
# the data dir's size sampled every 2s).
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${SCALE_KEYS:-1000 10000 100000}
MODES=${SCALE_MODES:-allow batch}
SHARES=${SCALE_SHARES:-0 0.5}
DURATION=${SCALE_DURATION:-20s}
WARMUP=${SCALE_WARMUP:-1s}
CONC=${SCALE_CONCURRENCY:-64}
BATCH=${SCALE_BATCH:-1000}
COORD_FLAGS=${SCALE_COORD_FLAGS:-}
GO=${GO:-go}

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'scale-leases.sh: %s\n' "$*" >&2; exit 1; }
for cmd in redis-server redis-cli jq curl awk; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is missing"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ration-scale.XXXXXX")
procs=()
stop_procs() {
  local p
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${procs[@]}"; do wait "$p" 2>/dev/null || true; done
  procs=()
}
cleanup() {
  stop_procs
  [ -n "${redis_pid:-}" ] && { kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; }
  if [ "${SCALE_KEEP:-0}" = 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "${SCALE_BIN:-}" ]; then
  bin=$SCALE_BIN
else
  bin=$work/bin
  say "building coordinator, gateway-agent and ration-bench"
  "$GO" build -o "$bin/" ./cmd/coordinator ./cmd/gateway-agent ./cmd/ration-bench
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit (tree differs)"

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    [ "$p" = 6379 ] && continue
    port_in_use "$p" || { echo "$p"; return; }
  done
  die "no free port"
}
wait_http() { # url, seconds
  local i
  for i in $(seq $(($2 * 10))); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
rss_kb() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
metric() { # file, name with labels as printed: sums every matching series
  awk -v m="$2" 'index($0, m) == 1 { s += $NF } END { printf "%.0f", s + 0 }' "$1"
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --dir "$work" --logfile "$work/redis.log" &
redis_pid=$!
for _ in $(seq 50); do [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && break; sleep 0.1; done
[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] || die "redis-server did not start"

rows=()
for share in $SHARES; do
  cat >"$work/rules.yaml" <<EOF
rules:
  - name: per-user
    match: {user: "*"}
    burst: 1000000
    rate: 1000000
    mode: leased
    on_failure: fail_closed
    lease: {default_share: $share}
EOF
for keys in $KEYS; do
  for mode in $MODES; do
    run="$work/$mode-$keys-$share"
    mkdir -p "$run/data"
    rp=$(free_port); gp=$(free_port); hp=$(free_port)
    # shellcheck disable=SC2086
    "$bin/coordinator" -id c1 -raft "127.0.0.1:$rp" -grpc "127.0.0.1:$gp" -http "127.0.0.1:$hp" \
      -admin 127.0.0.1:0 -data-dir "$run/data" -rules "$work/rules.yaml" -bootstrap -insecure $COORD_FLAGS 2>"$run/coordinator.log" &
    cpid=$!; procs+=("$cpid")
    wait_http "http://127.0.0.1:$hp/readyz" 20 || die "coordinator not ready (see $run/coordinator.log)"
    ag=$(free_port); ah=$(free_port)
    "$bin/gateway-agent" -id a1 -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" \
      -coordinators "127.0.0.1:$gp" -insecure -grpc "127.0.0.1:$ag" -http "127.0.0.1:$ah" 2>"$run/agent.log" &
    apid=$!; procs+=("$apid")
    wait_http "http://127.0.0.1:$ah/readyz" 20 || die "agent not ready (see $run/agent.log)"
    rss0=$(rss_kb "$cpid")
    load0=$(cut -d' ' -f1 /proc/loadavg)
    # The data dir's size every 2s while the load runs.
    ( while kill -0 "$cpid" 2>/dev/null; do
        printf '%s %s\n' "$(date +%s)" "$(du -sb "$run/data" | cut -f1)"; sleep 2
      done ) >"$run/log-bytes.txt" &
    sampler=$!
    args=(-target "127.0.0.1:$ag" -mode "$mode" -keys "$keys" -dist uniform -concurrency "$CONC"
      -duration "$DURATION" -warmup "$WARMUP" -pids "$cpid,$apid" -json)
    [ "$mode" = batch ] && args+=(-batch "$BATCH")
    say "ration-bench ${args[*]}"
    # Bounded: the measured window, the warmup and a minute for stragglers.
    timeout 120 "$bin/ration-bench" "${args[@]}" >"$run/bench.json" 2>"$run/bench.err" || say "ration-bench exited $? (see $run/bench.err)"
    load1=$(cut -d' ' -f1 /proc/loadavg)
    rss1=$(rss_kb "$cpid")
    arss=$(rss_kb "$apid")
    curl -s "http://127.0.0.1:$ah/metrics" >"$run/agent.metrics"
    curl -s "http://127.0.0.1:$hp/metrics" >"$run/coordinator.metrics"
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    logb=$(du -sb "$run/data" | cut -f1)
    stop_procs

    am=$run/agent.metrics cm=$run/coordinator.metrics
    fallback=$(metric "$am" 'ration_decisions_total{path="fallback"')
    leased=$(metric "$am" 'ration_decisions_total{path="leased"')
    quotas=$(metric "$cm" 'ration_coordinator_quotas{')
    cmds=$(metric "$cm" 'ration_coordinator_batch_commands_sum')
    entries=$(metric "$cm" 'ration_coordinator_batch_commands_count')
    apply_s=$(awk '/^ration_coordinator_apply_duration_seconds_sum/ { print $2 }' "$cm")
    renew_req=$(metric "$am" 'ration_agent_lease_renewals_total{result="ok"')
    row=$(jq -r --arg mode "$mode" --arg keys "$keys" --arg fb "$fallback" --arg leased "$leased" \
      --arg rss0 "$rss0" --arg rss1 "$rss1" --arg logb "$logb" --arg quotas "$quotas" \
      --arg cmds "$cmds" --arg entries "$entries" --arg apply "${apply_s:-0}" --arg renew "$renew_req" \
      --arg load "$load0 / $load1" --arg share "$share" --arg arss "$arss" '
      def r(x): (x * 10 | round) / 10;
      def r2(x): (x * 100 | round) / 100;
      def mb(x): r(x / 1048576);
      ($fb | tonumber) as $fb | ($leased | tonumber) as $leased | ($quotas | tonumber) as $q |
      ($entries | tonumber) as $e |
      "| \($share) | \($keys) | \(if $mode == "batch" then "AllowBatch \(.batch)" else "Allow" end) | \(.decisions_per_s | round) | " +
      "\(r(100 * .allowed / ([.decisions, 1] | max)))% | " +
      "\(r2(100 * $fb / ([$fb + $leased, 1] | max)))% (\($fb)) | " +
      "\(r(.latency_us.p50 / 1000)) / \(r(.latency_us.p99 / 1000)) ms | " +
      "\(mb(($rss0 | tonumber) * 1024)) → \(mb(($rss1 | tonumber) * 1024)) MB | " +
      "\(mb($logb | tonumber)) MB | \($q) | " +
      "\(if $q >= 1000 then "\(mb(($logb | tonumber) * 10000 / $q)) MB" else "-" end) | " +
      "\(if $e > 0 then r(($cmds | tonumber) / $e) else "-" end) / \(if $e > 0 then r(1000 * ($apply | tonumber) / $e) else "-" end) ms | " +
      "\($renew) | \(mb(($arss | tonumber) * 1024)) MB | \($load) |"' "$run/bench.json")
    rows+=("$row")
    printf '%s\n' "$row" >&2
  done
done
done

cat <<EOF
Measured on commit $commit, $(nproc) cores, $(date -u +%Y-%m-%d); -duration $DURATION after -warmup $WARMUP, -concurrency $CONC, uniform subjects.

| default_share | subjects | call | decisions/s | admitted | by failure policy (count) | p50 / p99 per call | coordinator RSS start → end | data dir (Raft log + snapshots) | quotas at the coordinator | data dir per 10,000 quotas | commands per entry / apply | Renew requests | agent RSS at end | load average start / end |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
EOF
printf '%s\n' "${rows[@]}"
