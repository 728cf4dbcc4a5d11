#!/usr/bin/env bash
# Hot keys: one rule in mode auto against the same rule in mode redis
# (docs/performance.md, Hot keys). On loopback only and bounded in time (about 2
# minutes with the defaults), it starts
#   - one redis-server on a free port (never 6379),
#   - a one-node coordinator (its own data dir, -bootstrap),
#   - two gateway-agents (a1, a2) on that Redis and that coordinator,
# with two rules of the same limit (burst and rate AUTO_LIMIT per subject):
# hot-redis in mode redis and hot-auto in mode auto (promote_above
# AUTO_PROMOTE). Each run drives one rule through both agents with two
# cmd/ration-bench processes in open loop, started together:
#   - the rest: AUTO_RATE/2 decisions/s, Zipf (s=1.1) over AUTO_KEYS subjects;
#   - the hot subject: AUTO_RATE/2 decisions/s, every one on one subject,
# so one subject carries half of all traffic. Subjects are fresh in every
# run (their prefixes name the round and mode), so no run inherits a bucket
# or a promotion. Runs alternate (redis, auto, then auto, redis, ...) because
# the machine is shared and its load drifts.
#
# Per run it reports: decisions/s; Redis script calls/s (EVAL/EVALSHA, the
# agents' decision round trips), every command/s and Redis CPU over the
# steady window (from 2s after the start to 2s before the end, by INFO
# deltas) and over the whole run; p50/p99 of the rest and of the hot subject
# (each from its own ration-bench: the two halves, not merged); the hot
# subject's admissions against B + r*T over its run (T = its measured
# window; no warmup, so every decision counts); decisions answered by a
# failure policy or failed; and, for mode auto, the time from the start of
# the load to the first decision on path leased (both agents' /metrics,
# polled every 100ms) and to each agent's ration_agent_hot_promotions_total.
#
# Knobs (environment): AUTO_RATE (total decisions/s, 600), AUTO_KEYS
# (1000000), AUTO_DURATION (seconds per run, 20), AUTO_ROUNDS (3: each mode
# runs this many times), AUTO_LIMIT (100: burst and rate per subject),
# AUTO_PROMOTE (100). The defaults are small because the machine they were
# chosen on (2 shared cores, load average above 20) carries no more; the
# hot subject is at 3x promote_above and 3x its rate. On a quiet machine:
# AUTO_RATE=4000 AUTO_LIMIT=1000 AUTO_PROMOTE=1000. AUTO_DECISION_TIMEOUT (the agents'
# -decision-timeout, 1s: on a shared, loaded machine scheduling delays
# alone pass the default 50ms, and then the failure policy, not a bucket,
# answers both modes), AUTO_BIN (a directory holding coordinator,
# gateway-agent and ration-bench already built; default: build them from
# this tree), AUTO_KEEP=1 keeps the work directory (JSON reports, logs,
# metrics polls).
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${AUTO_RATE:-600}
KEYS=${AUTO_KEYS:-1000000}
DUR=${AUTO_DURATION:-20}
ROUNDS=${AUTO_ROUNDS:-3}
LIMIT=${AUTO_LIMIT:-100}
PROMOTE=${AUTO_PROMOTE:-100}
DTIMEOUT=${AUTO_DECISION_TIMEOUT:-1s}
GO=${GO:-go}
# rules.HotTau: the time constant of the store's rate estimate. A subject
# that jumps from nothing to x decisions/s is estimated above promote_above
# p after TAU*ln(x/(x-p)).
TAU=1

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench-auto.sh: %s\n' "$*" >&2; exit 1; }
for cmd in redis-server redis-cli jq curl awk; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is missing"
done
[[ $DUR =~ ^[0-9]+$ ]] && [ "$DUR" -ge 8 ] && [ "$DUR" -le 300 ] || die "AUTO_DURATION=$DUR: want whole seconds in [8, 300]"
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 10 ] || die "AUTO_ROUNDS=$ROUNDS: want 1 to 10"
half=$(awk -v r="$RATE" 'BEGIN { printf "%g", r / 2 }')

work=$(mktemp -d "${TMPDIR:-/tmp}/ration-auto.XXXXXX")
procs=()
cleanup() {
  local p
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${procs[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${AUTO_KEEP:-0}" = 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
# forget PID: a process that has ended leaves procs, so cleanup never
# signals a pid the system may have reused.
forget() {
  local p keep=()
  for p in "${procs[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  procs=("${keep[@]}")
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "${AUTO_BIN:-}" ]; then
  bin=$AUTO_BIN
else
  bin=$work/bin
  say "building coordinator, gateway-agent and ration-bench"
  "$GO" build -o "$bin/" ./cmd/coordinator ./cmd/gateway-agent ./cmd/ration-bench
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no -- cmd internal proto go.mod go.sum scripts/bench-auto.sh 2>/dev/null)" ] ||
  commit="$commit (tree differs in cmd/, internal/, proto/ or go.mod)"

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# free_port: sets port to a free one, never 6379 and never one it gave
# before (a port handed out but not yet bound looks free).
used_ports=" "
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    [ "$p" = 6379 ] && continue
    case $used_ports in *" $p "*) continue ;; esac
    port_in_use "$p" || { used_ports+="$p "; port=$p; return; }
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
now() { date +%s.%N; }
# metric file name filter...: sums every series of name whose labels hold
# every filter (e.g. 'path="leased"').
metric() {
  local f=$1 name=$2
  shift 2
  awk -v name="$name" -v filters="$*" '
    BEGIN { n = split(filters, fs, " ") }
    $1 == name || index($1, name "{") == 1 {
      for (i = 1; i <= n; i++) if (index($1, fs[i]) == 0) next
      s += $NF
    }
    END { printf "%.0f", s + 0 }' "$f"
}
cpu_ticks() { # utime+stime of a process, in clock ticks
  awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0
}
# snap FILE: one line "time script_calls all_commands redis_cpu_s a1_ticks a2_ticks".
snap() {
  local t info
  t=$(now)
  info=$(redis-cli -p "$redis_port" INFO all | tr -d '\r')
  awk -v t="$t" -v a1="$(cpu_ticks "$a1_pid")" -v a2="$(cpu_ticks "$a2_pid")" -F'[:,=]' '
    /^cmdstat_(eval|evalsha|eval_ro|evalsha_ro):/ { calls += $3 }
    /^total_commands_processed:/ { total = $2 }
    /^used_cpu_(sys|user):/ { cpu += $2 }
    END { printf "%s %d %d %.6f %d %d\n", t, calls, total, cpu, a1, a2 }' <<<"$info" >"$1"
}

free_port; redis_port=$port
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --dir "$work" --logfile "$work/redis.log" &
redis_pid=$!; procs+=("$redis_pid")
for _ in $(seq 50); do [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && break; sleep 0.1; done
[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] || die "redis-server did not start"

cat >"$work/rules.yaml" <<EOF
rules:
  - name: hot-redis
    match: {tenant: "*"}
    burst: $LIMIT
    rate: $LIMIT
    mode: redis
  - name: hot-auto
    match: {tenant_auto: "*"}
    burst: $LIMIT
    rate: $LIMIT
    mode: auto
    auto: {promote_above: $PROMOTE}
EOF

mkdir -p "$work/data"
free_port; rp=$port; free_port; gp=$port; free_port; hp=$port
"$bin/coordinator" -id c1 -raft "127.0.0.1:$rp" -grpc "127.0.0.1:$gp" -http "127.0.0.1:$hp" \
  -admin 127.0.0.1:0 -data-dir "$work/data" -rules "$work/rules.yaml" -bootstrap -insecure 2>"$work/coordinator.log" &
coord_pid=$!; procs+=("$coord_pid")
wait_http "http://127.0.0.1:$hp/readyz" 30 || die "coordinator not ready (see $work/coordinator.log)"
agent_grpc=() agent_http=()
for id in a1 a2; do
  free_port; ag=$port; free_port; ah=$port
  "$bin/gateway-agent" -id "$id" -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" \
    -coordinators "127.0.0.1:$gp" -insecure -grpc "127.0.0.1:$ag" -http "127.0.0.1:$ah" \
    -decision-timeout "$DTIMEOUT" 2>"$work/$id.log" &
  pid=$!; procs+=("$pid")
  eval "${id}_pid=$pid"
  agent_grpc+=("127.0.0.1:$ag"); agent_http+=("127.0.0.1:$ah")
done
for i in 0 1; do
  wait_http "http://${agent_http[$i]}/readyz" 30 || die "agent a$((i + 1)) not ready (see $work/a$((i + 1)).log)"
done
targets=$(IFS=,; echo "${agent_grpc[*]}")
say "redis 127.0.0.1:$redis_port, coordinator 127.0.0.1:$gp, agents $targets"

# poll_metrics OUT RULE: every 100ms until killed (and at most the run plus
# 30s), "unix-time leased-decisions-of-RULE promotions-a1 promotions-a2".
poll_metrics() {
  local out=$1 rule=$2 i m1 m2
  m1=$work/poll-a1.prom m2=$work/poll-a2.prom
  for i in $(seq $(((DUR + 30) * 10))); do
    curl -s -m 1 "http://${agent_http[0]}/metrics" >"$m1" || true
    curl -s -m 1 "http://${agent_http[1]}/metrics" >"$m2" || true
    printf '%s %s %s %s\n' "$(now)" \
      "$(($(metric "$m1" ration_decisions_total 'path="leased"' "rule=\"$rule\"") + $(metric "$m2" ration_decisions_total 'path="leased"' "rule=\"$rule\"")))" \
      "$(metric "$m1" ration_agent_hot_promotions_total)" "$(metric "$m2" ration_agent_hot_promotions_total)" >>"$out"
    sleep 0.1
  done
}

rows=()
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
  order="redis auto"
  [ $((round % 2)) = 0 ] && order="auto redis"
  for mode in $order; do
    rule=hot-$mode
    run=$work/$round-$mode
    mkdir -p "$run"
    # -timeout 30s: a call the client gives up on is cancelled at the agent,
    # which counts it as a store failure and can open the
    # breaker for every caller; a long deadline keeps that out of the run.
    common=(-mode allow -target "$targets" -rule "$rule" -rate "$half" -duration "${DUR}s" -warmup 0 -timeout 30s -json)
    # The counters before the run (both agents), then the load.
    poll_metrics "$run/poll.txt" "$rule" &
    poller=$!; procs+=("$poller")
    sleep 0.3
    snap "$run/s0"
    t0=$(now)
    say "round $round, $rule: ${half}/s on one subject + ${half}/s Zipf over $KEYS subjects, ${DUR}s"
    timeout $((DUR + 60)) "$bin/ration-bench" "${common[@]}" -dist hot -keys 1 -key-prefix "hot-$round-$mode-" \
      >"$run/hot.json" 2>"$run/hot.err" &
    hb=$!; procs+=("$hb")
    timeout $((DUR + 60)) "$bin/ration-bench" "${common[@]}" -dist zipf -zipf-s 1.1 -keys "$KEYS" -key-prefix "z$round-$mode-" \
      >"$run/rest.json" 2>"$run/rest.err" &
    zb=$!; procs+=("$zb")
    sleep 2; snap "$run/s1"
    sleep $((DUR - 4)); snap "$run/s2"
    wait "$hb" || say "ration-bench (hot) exited $? (see $run/hot.err)"
    forget "$hb"
    wait "$zb" || say "ration-bench (rest) exited $? (see $run/rest.err)"
    forget "$zb"
    snap "$run/s3"
    sleep 1
    kill "$poller" 2>/dev/null || true; wait "$poller" 2>/dev/null || true
    forget "$poller"
    curl -s "http://${agent_http[0]}/metrics" >"$run/a1.prom"
    curl -s "http://${agent_http[1]}/metrics" >"$run/a2.prom"

    # Time to promotion: the first poll (taken before the load) gives the
    # counters before the run; then the first sample past it in leased
    # decisions, and per agent in promotions taken up, from t0 (the launch).
    promo=$(awk -v t0="$t0" '
      NR == 1 { l0 = $2; a0 = $3; b0 = $4; next }
      first == "" && $2 > l0 { first = sprintf("%.1f", $1 - t0) }
      pa == "" && $3 > a0 { pa = sprintf("%.1f", $1 - t0) }
      pb == "" && $4 > b0 { pb = sprintf("%.1f", $1 - t0) }
      END { printf "%s %s %s\n", (first == "" ? "never" : first), (pa == "" ? "never" : pa), (pb == "" ? "never" : pb) }' "$run/poll.txt")
    row=$(jq -rn --slurpfile hot "$run/hot.json" --slurpfile rest "$run/rest.json" \
      --arg s0 "$(cat "$run/s0")" --arg s1 "$(cat "$run/s1")" --arg s2 "$(cat "$run/s2")" --arg s3 "$(cat "$run/s3")" \
      --arg mode "$mode" --arg round "$round" --arg promo "$promo" --arg limit "$LIMIT" --arg promote "$PROMOTE" \
      --arg tau "$TAU" \
      --arg tck "$(getconf CLK_TCK)" '
      def r(x): (x * 10 | round) / 10;
      def ms(x): r(x / 1000);
      def f(s): s | split(" ") | map(tonumber);
      ($hot[0]) as $h | ($rest[0]) as $z |
      f($s0) as $a | f($s1) as $b | f($s2) as $c | f($s3) as $d |
      def rate(p; q; i): (q[i] - p[i]) / (q[0] - p[0]);
      ($limit | tonumber) as $lim |
      ($lim + $lim * $h.elapsed_s) as $bound |
      ([$h.allowed - $bound, 0] | max) as $over |
      ($promo | split(" ")) as $p |
      "| \($round) | \($mode) | \(($h.decisions_per_s + $z.decisions_per_s) | round) (hot \($h.decisions_per_s | round)) | " +
      "\(rate($b; $c; 1) | round) (\(rate($a; $d; 1) | round)) | " +
      "\(rate($b; $c; 2) | round) | " +
      "\(r(100 * rate($b; $c; 3)))% | " +
      "\(r(100 * (rate($b; $c; 4) + rate($b; $c; 5)) / ($tck | tonumber)))% | " +
      "\(ms($z.latency_us.p50)) / \(ms($z.latency_us.p99)) ms | " +
      "\(ms($h.latency_us.p50)) / \(ms($h.latency_us.p99)) ms | " +
      "\($h.allowed) / \($bound | floor) (\(r(100 * $h.allowed / $bound))%) | \($over | ceil) | " +
      "\($h.failure_policy + $z.failure_policy) / \($h.errors + $z.errors) | " +
      ($h.decisions_per_s) as $x | ($promote | tonumber) as $pa |
      (if $x > $pa then "\(r(($tau | tonumber) * ($x / ($x - $pa) | log))) s" else "never" end) as $cross |
      (if $mode == "auto" then "\($p[0]) s (a1 \($p[1]), a2 \($p[2])); estimate crossed at \($cross) |" else "- |" end)')
    jq -rn --slurpfile hot "$run/hot.json" --slurpfile rest "$run/rest.json" --arg s1 "$(cat "$run/s1")" --arg s2 "$(cat "$run/s2")" --arg mode "$mode" '
      def f(s): s | split(" ") | map(tonumber);
      f($s1) as $b | f($s2) as $c |
      "\($mode) \(($c[1] - $b[1]) / ($c[0] - $b[0])) \($hot[0].decisions_per_s / ($hot[0].decisions_per_s + $rest[0].decisions_per_s))"' >>"$work/summary.txt"
    rows+=("$row")
    printf '%s\n' "$row" >&2
    sleep 2
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

cat <<EOF
Measured on commit $commit, $(nproc) cores, $(date -u +%Y-%m-%d); load average $load_start at the start, $load_end at the end.
Per run: ${DUR}s, open loop, $half decisions/s on one subject and $half decisions/s Zipf (s=1.1) over $KEYS subjects, through 2 agents on one Redis;
rule burst $LIMIT, rate $LIMIT/s per subject, agents' -decision-timeout $DTIMEOUT; mode auto: promote_above $PROMOTE/s (demote_below and hold by default).
Redis columns: steady window (2s after the start to 2s before the end); in brackets, script calls/s over the whole run. Commands/s count the commands inside each script too (INFO total_commands_processed).
Promotion: seconds from the launch of the load to the first poll (every 100ms, both agents' /metrics) that shows a decision on path leased, and to each agent's first promotion taken up; and when the store's rate estimate (time constant ${TAU}s) crossed promote_above at the hot subject's measured rate.

| round | mode | decisions/s (hot subject) | Redis script calls/s (whole run) | Redis commands/s | Redis CPU | agents' CPU (both) | p50 / p99, the other subjects | p50 / p99, hot subject | hot admitted / B + r·T | overshoot | failure policy / errors | first leased decision (promotion taken up) |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
EOF
printf '%s\n' "${rows[@]}"
awk '
  { calls[$1] += $2; share[$1] += $3; n[$1]++ }
  END {
    r = calls["redis"] / n["redis"]; a = calls["auto"] / n["auto"]
    printf "\nRedis script calls/s in the steady windows, mean of the runs: mode redis %.0f, mode auto %.0f: auto is %.0f%% of redis, %.0f%% fewer; the hot subject was %.0f%% of the decisions.\n",
      r, a, 100 * a / r, 100 * (1 - a / r), 100 * (share["redis"] + share["auto"]) / (n["redis"] + n["auto"])
  }' "$work/summary.txt"
