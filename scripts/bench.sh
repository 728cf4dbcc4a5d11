#!/usr/bin/env bash
# Ration's reproducible benchmark run (make bench). On loopback only, bounded
# in time (about 4 minutes), it
#   1. runs the Go benchmarks (go test -bench) of every package that has any,
#      the leased decision (internal/holder, -cpu 1,2) and the renewals/s of
#      a 3-node coordinator group (internal/coordinator) with their own flags;
#   2. starts its own redis-server on a free port (never 6379; no persistence),
#      a one-node coordinator (coordinator -dev, temporary data dir) and a
#      gateway-agent built from this tree, with rules it writes (one of them
#      mode: leased, given to both the coordinator and the agent);
#   3. drives the agent with cmd/ration-bench: the empty gRPC call (floor),
#      unary Allow, Envoy's ShouldRateLimit, AllowBatch, AllowStream and
#      HTTP check on the Redis path
#      (10k keys and one hot key), unary Allow and AllowBatch on the leased
#      path, with the CPU of the agent, Redis and the coordinator per
#      decision; then, open loop, a Redis-path and a leased unary Allow at
#      one gateway's rate of the capacity plan (the agent's CPU there), and
#      the empty call, a Redis-path and a leased decision at a light rate
#      (the latency budget);
#   4. measures the Redis ceiling: redis-benchmark running EVALSHA of the
#      agent's own script (internal/bucket/redis.lua) at pipeline 1 and 16,
#      and one client unpipelined (the bare round trip) with the script's
#      own time from INFO commandstats;
#   5. writes docs/performance.md (BENCH_OUT to write elsewhere), ending with
#      the `ration-bench plan` flags these figures give (docs/capacity.md),
#      then the hand-written record that follows the keep marker in the
#      current page (what past changes bought), carried over unchanged.
#
# Knobs (environment): BENCH_DURATION (5s), BENCH_WARMUP (1s),
# BENCH_CONCURRENCY (64), BENCH_KEYS (10000), BENCH_BATCH (100),
# BENCH_BIG_BATCH (1000) and BENCH_BIG_CONCURRENCY (8) for the large
# batches, BENCH_LIGHT_RATE (1000 decisions/s) and BENCH_LIGHT_DURATION
# (10s) for the latency rows, BENCH_GATEWAY_RATE (5000 decisions/s: one
# gateway of the capacity plan), BENCH_GO_BENCHTIME (1s),
# BENCH_RENEW_BENCHTIME (3s), BENCH_DECISION_TIMEOUT (1s: the agent's
# -decision-timeout), BENCH_OUT (docs/performance.md),
# BENCH_NOTE (a sentence about the conditions, added to the doc),
# BENCH_COMMIT (names the code measured when this is not a git checkout),
# BENCH_KEEP=1 keeps the work directory (JSON reports, logs).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-5s}
WARMUP=${BENCH_WARMUP:-1s}
CONC=${BENCH_CONCURRENCY:-64}
KEYS=${BENCH_KEYS:-10000}
BATCH=${BENCH_BATCH:-100}
BIG_BATCH=${BENCH_BIG_BATCH:-1000}
# 8 callers with 1000 decisions each keep as many scripts queued at Redis
# as 64 callers with 100 (the Redis row needs that to stay inside the
# decision timeout); the leased row uses the same load for comparison.
BIG_CONC=${BENCH_BIG_CONCURRENCY:-8}
LIGHT_RATE=${BENCH_LIGHT_RATE:-1000}
# Long enough for 10^4 samples, so the p99 does not rest on a few stalls.
LIGHT_DURATION=${BENCH_LIGHT_DURATION:-10s}
GATEWAY_RATE=${BENCH_GATEWAY_RATE:-5000}
GO_BENCHTIME=${BENCH_GO_BENCHTIME:-1s}
RENEW_BENCHTIME=${BENCH_RENEW_BENCHTIME:-3s}
# 64 callers with batches of 100 keep 6400 scripts queued at Redis, more
# than the agent's default 50ms -decision-timeout lets through on a small
# machine; the benchmark measures throughput, so it waits longer (every
# row still reports decisions a failure policy answered).
DECISION_TIMEOUT=${BENCH_DECISION_TIMEOUT:-1s}
OUT=${BENCH_OUT:-docs/performance.md}
GO=${GO:-go}

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench.sh: %s\n' "$*" >&2; exit 1; }

for cmd in redis-server redis-cli redis-benchmark jq awk sha1sum "$GO"; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is missing (make deps installs redis; jq: apt-get install jq)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ration-bench.XXXXXX")
mkdir -p "$work/bin" "$work/results"
procs=()
cleanup() {
  local p
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${procs[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${BENCH_KEEP:-0}" = 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

script_start=$(date +%s)
loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
# What was measured: the commit, and whether the tree differed from it.
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit with uncommitted changes"
else
  commit=${BENCH_COMMIT:-unknown (not a git checkout)}
fi

# 1. Go benchmarks ----------------------------------------------------------
# bench_lines keeps go test's results and a failure's own message, not the
# logs that tests and benchmarks print.
bench_lines() {
  awk '/^--- FAIL/ { f = 1; print; next }
       f && /^    / { print; next }
       { f = 0 }
       /^(Benchmark|goos|goarch|cpu|pkg|ok|PASS|FAIL|\(no package)/ { print }' "$1"
}
pkgs=()
for dir in internal/bucket internal/rules $(grep -rl --include='*_test.go' '^func Benchmark' internal cmd 2>/dev/null | xargs -r -n1 dirname | sort -u); do
  pkg="./$dir"
  # These two run below with their own flags.
  case "$pkg" in ./internal/holder | ./internal/coordinator) continue ;; esac
  [[ " ${pkgs[*]:-} " == *" $pkg "* ]] && continue
  if grep -qs '^func Benchmark' "$dir"/*_test.go; then
    pkgs+=("$pkg")
  else
    say "no benchmarks in $pkg: skipped"
  fi
done
gotest_status=0
gotest_cmd="$GO test -run '^\$' -bench . -benchmem -benchtime $GO_BENCHTIME -count 1 -timeout 3m ${pkgs[*]:-}"
if [ ${#pkgs[@]} -gt 0 ]; then
  say "$gotest_cmd"
  # A failing benchmark does not stop the run: it is reported in the doc
  # and makes the script exit non-zero at the end.
  "$GO" test -run '^$' -bench . -benchmem -benchtime "$GO_BENCHTIME" -count 1 -timeout 3m "${pkgs[@]}" \
    >"$work/gotest-bench.txt" 2>&1 || gotest_status=$?
  bench_lines "$work/gotest-bench.txt" >&2
  [ "$gotest_status" -eq 0 ] || say "go test -bench exited $gotest_status: continuing; reported in $OUT"
else
  echo "(no package has benchmarks)" >"$work/gotest-bench.txt"
fi
# The leased decision in process (no gRPC): one and two cores; and what a
# 3-node coordinator group on loopback commits, in Renew requests per second.
leased_cmd="$GO test -run '^\$' -bench LeasedTake -benchmem -cpu 1,2 -count 1 -timeout 3m ./internal/holder/"
renew_cmd="$GO test -run '^\$' -bench 'Renew\$' -benchtime $RENEW_BENCHTIME -count 1 -timeout 5m ./internal/coordinator/"
say "$leased_cmd"
"$GO" test -run '^$' -bench LeasedTake -benchmem -cpu 1,2 -count 1 -timeout 3m ./internal/holder/ \
  >"$work/gotest-leased.txt" 2>&1 || gotest_status=$?
bench_lines "$work/gotest-leased.txt" >&2
say "$renew_cmd"
"$GO" test -run '^$' -bench 'Renew$' -benchtime "$RENEW_BENCHTIME" -count 1 -timeout 5m ./internal/coordinator/ \
  >"$work/gotest-renew.txt" 2>&1 || gotest_status=$?
bench_lines "$work/gotest-renew.txt" >&2
[ "$gotest_status" -eq 0 ] || say "a go test -bench run failed: continuing; reported in $OUT"

# 2. redis-server, gateway-agent ------------------------------------------
say "building gateway-agent, coordinator and ration-bench"
"$GO" build -o "$work/bin/gateway-agent" ./cmd/gateway-agent
"$GO" build -o "$work/bin/coordinator" ./cmd/coordinator
"$GO" build -o "$work/bin/ration-bench" ./cmd/ration-bench
bench="$work/bin/ration-bench"

# shellcheck source=scripts/lib/redis.sh
. scripts/lib/redis.sh # the working directory is the repository root (above)
start_redis

cat >"$work/rules.yaml" <<'EOF'
rules:
  # Most decisions admitted: a large burst and a high rate per user.
  - name: bench
    match: {user: "*"}
    burst: 1000000
    rate: 1000000
    on_failure: fail_closed
  # One hot key with a real limit: past its first 1000 tokens nearly every
  # decision is denied, which costs the same script run as an admission.
  - name: hot
    match: {hot: "*"}
    burst: 1000
    rate: 1000
    on_failure: fail_closed
  # Leased: decided in the agent's memory from a slice leased from the
  # coordinator (one quota per subject). Burst and rate are far above what
  # this machine can ask for, so the slice, not the rule, is the limit.
  - name: leased
    match: {leased: "*"}
    burst: 1000000000
    rate: 1000000000
    mode: leased
    on_failure: fail_closed
    lease: {period: 10s}
EOF

# A one-node coordinator group (temporary data dir, deleted on exit) with
# the same rules file: it leases only the mode: leased rule.
"$work/bin/coordinator" -dev -rules "$work/rules.yaml" -raft 127.0.0.1:0 -grpc 127.0.0.1:0 -http 127.0.0.1:0 \
  -admin 127.0.0.1:0 2>"$work/coordinator.log" &
cpid=$!
procs+=("$cpid")
for _ in $(seq 100); do
  grep -q 'leader ready' "$work/coordinator.log" 2>/dev/null && break
  kill -0 "$cpid" 2>/dev/null || { cat "$work/coordinator.log" >&2; die "coordinator exited"; }
  sleep 0.1
done
grep -q 'leader ready' "$work/coordinator.log" || { cat "$work/coordinator.log" >&2; die "coordinator not ready after 10s"; }
COORD=$(sed -n 's/.*coordinator started.* grpc_addr=\([^ ]*\).*/\1/p' "$work/coordinator.log" | head -1)
[ -n "$COORD" ] || die "could not read the coordinator's gRPC address from its log"
say "coordinator -dev on grpc $COORD (pid $cpid)"

"$work/bin/gateway-agent" -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" \
  -coordinators "$COORD" -insecure -grpc 127.0.0.1:0 -http 127.0.0.1:0 -id bench -log-level info \
  -decision-timeout "$DECISION_TIMEOUT" 2>"$work/agent.log" &
apid=$!
procs+=("$apid")
for _ in $(seq 100); do
  grep -q 'store answered: ready' "$work/agent.log" 2>/dev/null && break
  kill -0 "$apid" 2>/dev/null || { cat "$work/agent.log" >&2; die "gateway-agent exited"; }
  sleep 0.1
done
grep -q 'store answered: ready' "$work/agent.log" || { cat "$work/agent.log" >&2; die "gateway-agent not ready after 10s"; }
GRPC=$(sed -n 's/.*gateway-agent started.* grpc=\([^ ]*\).*/\1/p' "$work/agent.log" | head -1)
HTTP=$(sed -n 's/.*gateway-agent started.* http=\([^ ]*\).*/\1/p' "$work/agent.log" | head -1)
[ -n "$GRPC" ] && [ -n "$HTTP" ] || die "could not read the agent's addresses from its log"
say "gateway-agent on grpc $GRPC, http $HTTP (pid $apid)"

# 3. the matrix -------------------------------------------------------------
common="-duration $DURATION -warmup $WARMUP -pids $apid,$rpid,$cpid -json"
C="-concurrency $CONC"
BC="-concurrency $BIG_CONC"
# name | what it is | flags (GRPC and HTTP are expanded when run)
matrix=(
  "empty|empty unary (grpc.health.v1 Check): the floor|-mode empty -target \$GRPC $C"
  "allow|unary Allow, $KEYS keys uniform|-mode allow -target \$GRPC -keys $KEYS -dist uniform $C"
  "envoy|Envoy ShouldRateLimit, one descriptor, $KEYS keys uniform|-mode envoy -target \$GRPC -keys $KEYS -dist uniform $C"
  "allow-hot|unary Allow, 1 hot key (over its limit)|-mode allow -target \$GRPC -descriptor-key hot -dist hot $C"
  "batch|AllowBatch of $BATCH, $KEYS keys uniform|-mode batch -batch $BATCH -target \$GRPC -keys $KEYS -dist uniform $C"
  "batch-hot|AllowBatch of $BATCH, 1 hot key (over its limit)|-mode batch -batch $BATCH -target \$GRPC -descriptor-key hot -dist hot $C"
  "batch-big|AllowBatch of $BIG_BATCH, $KEYS keys uniform, $BIG_CONC callers|-mode batch -batch $BIG_BATCH -target \$GRPC -keys $KEYS -dist uniform $BC"
  "stream|AllowStream, $KEYS keys uniform|-mode stream -target \$GRPC -keys $KEYS -dist uniform $C"
  "http|HTTP GET /v1/check, $KEYS keys uniform|-mode http -http-target \$HTTP -keys $KEYS -dist uniform $C"
  "leased|leased: unary Allow, 1 hot key|-mode allow -target \$GRPC -descriptor-key leased -key-prefix u -dist hot $C"
  "leased-keys|leased: unary Allow, 1000 keys uniform|-mode allow -target \$GRPC -descriptor-key leased -key-prefix m -keys 1000 -dist uniform $C"
  "leased-batch-big|leased: AllowBatch of $BIG_BATCH, 1 hot key, $BIG_CONC callers|-mode batch -batch $BIG_BATCH -target \$GRPC -descriptor-key leased -key-prefix b -dist hot $BC"
)
# One gateway's share of the capacity plan's example (10^6 decisions/s over
# 200 gateways): the agent's CPU per decision at that rate, where calls are
# too sparse to share wake-ups and syscalls the way a saturated agent does.
gateway=(
  "gw-allow|unary Allow (Redis path) at $GATEWAY_RATE/s, $KEYS keys|-mode allow -target \$GRPC -keys $KEYS -dist uniform -rate $GATEWAY_RATE"
  "gw-leased|unary Allow (leased) at $GATEWAY_RATE/s, 1 hot key|-mode allow -target \$GRPC -descriptor-key leased -key-prefix g -dist hot -rate $GATEWAY_RATE"
)
# The latency budget: a light fixed rate (open loop, latency from the
# intended send time), so queueing on this small machine does not hide
# what the gRPC hop, the Redis round trip and the leased decision cost.
light=(
  "light-empty|empty unary at $LIGHT_RATE/s|-mode empty -target \$GRPC -rate $LIGHT_RATE -duration $LIGHT_DURATION"
  "light-allow|unary Allow (Redis path) at $LIGHT_RATE/s, $KEYS keys|-mode allow -target \$GRPC -keys $KEYS -dist uniform -rate $LIGHT_RATE -duration $LIGHT_DURATION"
  "light-leased|unary Allow (leased) at $LIGHT_RATE/s, 1 hot key|-mode allow -target \$GRPC -descriptor-key leased -key-prefix l -dist hot -rate $LIGHT_RATE -duration $LIGHT_DURATION"
)
for row in "${matrix[@]}" "${gateway[@]}" "${light[@]}"; do
  IFS='|' read -r name _ flags <<<"$row"
  expanded=${flags//\$GRPC/$GRPC}
  expanded=${expanded//\$HTTP/$HTTP}
  say "ration-bench $common $flags"
  # shellcheck disable=SC2086 # flags are words; a row's own flags come last and win
  "$bench" $common $expanded >"$work/results/$name.json"
  jq -r '"   \(.decisions_per_s) decisions/s (\(.decided_per_s) decided by a bucket), p50 \(.latency_us.p50)µs, p99 \(.latency_us.p99)µs, failure policy \(.failure_policy), errors \(.errors)"' \
    "$work/results/$name.json" >&2
done

# 4. the Redis ceiling: redis-benchmark running the agent's own script ----
script=internal/bucket/redis.lua
sha=$(redis-cli -p "$redis_port" -x SCRIPT LOAD <"$script")
[ "$sha" = "$(sha1sum "$script" | cut -d' ' -f1)" ] || die "SCRIPT LOAD answered $sha, not the SHA1 of $script"
# The agent's call for rule bench: KEYS[1] = bucket, ARGV = op, burst, rate,
# cost, numbers as the agent formats them, and the bucket's TTL in ms when
# last = now (bucket.scriptTTL: twice B/r = 1s plus the 1s margin, rounded
# up; the request-id TTL follows only with a request id, which these
# requests do not carry).
evalsha=(EVALSHA "$sha" 1 'ration:{bench|user=k__rand_int__}' take 1e+06 1e+06 1 4000)
# One call first: a script whose arguments changed answers an error here,
# named, instead of redis-benchmark counting errors as requests.
probe=$(redis-cli -p "$redis_port" "${evalsha[@]/__rand_int__/probe}" 2>&1)
case "$probe" in
  *ERR*) die "EVALSHA with the arguments of this script failed ($probe): update evalsha in scripts/bench.sh to the script's ARGV" ;;
esac
rb() { # rb CLIENTS PIPELINE N: one CSV line of results
  timeout 120 redis-benchmark -h 127.0.0.1 -p "$redis_port" -c "$1" -n "$3" -P "$2" -r "$KEYS" --csv "${evalsha[@]}" | tail -1
}
# cpu_s PID: utime+stime of a process in seconds (fields 14, 15 of stat;
# the command name in field 2 has no spaces here).
tck=$(getconf CLK_TCK)
cpu_s() { awk -v t="$tck" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$1/stat"; }
declare -A ceiling ceiling_us
declare -a ceiling_cmd
for pipe in 1 16; do
  # A short probe sizes the run to about the matrix's duration.
  probe=$(rb "$CONC" "$pipe" 20000 | awk -F'","' '{print $2}')
  secs=$(awk -v d="$DURATION" 'BEGIN { sub(/s$/, "", d); print d + 0 }')
  n=$(awk -v r="$probe" -v s="$secs" 'BEGIN { n = int(r * s); if (n < 50000) n = 50000; print n }')
  say "redis-benchmark -c $CONC -n $n -P $pipe -r $KEYS --csv ${evalsha[*]}"
  c0=$(cpu_s "$rpid")
  line=$(rb "$CONC" "$pipe" "$n")
  c1=$(cpu_s "$rpid")
  ceiling[$pipe]=$line
  # redis-server's CPU per script: one shard is one core, so 10^6 / this
  # is what one shard runs per second when its core is the limit.
  ceiling_us[$pipe]=$(awk -v a="$c0" -v b="$c1" -v n="$n" 'BEGIN { printf "%.1f", (b - a) * 1e6 / n }')
  echo "   $line; redis-server ${ceiling_us[$pipe]} µs CPU per script" >&2
  ceiling_cmd[$pipe]="redis-benchmark -h 127.0.0.1 -p \$REDIS_PORT -c $CONC -n $n -P $pipe -r $KEYS --csv EVALSHA \$SHA 1 'ration:{bench|user=k__rand_int__}' take 1e+06 1e+06 1 4000"
done
# The bare round trip: one client, one script at a time (no queue), and
# the script's own time inside Redis from INFO commandstats.
rtt_n=20000
redis-cli -p "$redis_port" CONFIG RESETSTAT >/dev/null
say "redis-benchmark -c 1 -n $rtt_n -P 1 -r $KEYS --csv ${evalsha[*]}"
rtt=$(rb 1 1 "$rtt_n")
echo "   $rtt" >&2
script_us=$(redis-cli -p "$redis_port" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
[ -n "$script_us" ] || script_us="n/a"
rtt_cmd="redis-benchmark -h 127.0.0.1 -p \$REDIS_PORT -c 1 -n $rtt_n -P 1 -r $KEYS --csv EVALSHA \$SHA 1 'ration:{bench|user=k__rand_int__}' take 1e+06 1e+06 1 4000"
csv_field() { awk -F'","' -v i="$2" '{ gsub(/^"|"$/, ""); print $i }' <<<"$1"; }

# 5. docs/performance.md ----------------------------------------------------
r() { jq -r "$2" "$work/results/$1.json"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
verdict() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN { ok = (op == ">=") ? (v >= t) : (op == "<=") ? (v <= t) : (v < t); if (v == "n/a" || v == "") print "n/a"; else print ok ? "met" : "**not met**" }'; }
# bench_metric FILE NAME UNIT: the value before UNIT on benchmark NAME's line
# (NAME without the -GOMAXPROCS suffix; the first match).
bench_metric() {
  awk -v name="$2" -v unit="$3" '
    $1 == name || index($1, name "-") == 1 && $1 ~ ("^" name "-[0-9]+$") {
      for (i = 3; i <= NF; i++) if ($i == unit) { print $(i - 1); exit }
    }' "$1"
}

loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
empty_rate=$(r empty .decisions_per_s)
allow_rate=$(r allow .decided_per_s)
batch_rate=$(r batch .decided_per_s)
bigbatch_rate=$(r batch-big .decided_per_s)
leased_rate=$(r leased .decided_per_s)
leased_big_rate=$(r leased-batch-big .decided_per_s)
ceil16=$(csv_field "${ceiling[16]}" 2 | awk '{ printf "%.0f", $1 }')
ceil1=$(csv_field "${ceiling[1]}" 2 | awk '{ printf "%.0f", $1 }')
allow_p99_ms=$(awk -v us="$(r allow .latency_us.p99)" 'BEGIN { printf "%.2f", us / 1000 }')
r_allow=$(ratio "$allow_rate" "$empty_rate")
r_batch=$(ratio "$batch_rate" "$ceil16")
r_leased_allow=$(ratio "$leased_rate" "$allow_rate")
r_leased_empty=$(ratio "$leased_rate" "$empty_rate")
r_leased_big=$(ratio "$leased_big_rate" "$bigbatch_rate")
r_leased_big_ceil=$(ratio "$leased_big_rate" "$ceil16")
elapsed=$(( $(date +%s) - script_start ))
# All CPU one decision costs (agent, redis, coordinator, tool): when they
# share the CPUs and keep them busy, decisions/s ratios follow these costs.
cpu_all() { r "$1" '((.cpu_total_us_per_decision + (.self_cpu.us_per_decision // 0)) * 10 | round) / 10'; }
cpu_empty=$(cpu_all empty)
cpu_allow=$(cpu_all allow)
cpu_leased=$(cpu_all leased)
cpu_bound=$(ratio "$cpu_empty" "$cpu_allow")
# The servers' CPU per decision (agent + redis + coordinator): steadier
# than decisions/s when other work on the machine takes a varying share.
srv() { r "$1" '.cpu_total_us_per_decision'; }
# The Redis path's targets: the servers' CPU of a Redis-path unary Allow against
# the empty call, Envoy's path against unary Allow, the script's own time.
r16_cpu=$(ratio "$(srv allow)" "$(srv empty)")
r16_envoy=$(ratio "$(srv envoy)" "$(srv allow)")

# Per-decision costs for the capacity plan (docs/capacity.md).
plan_redis_us=${ceiling_us[1]}
plan_agent_us=$(r gw-allow '.cpu[0].us_per_decision')
plan_agent_leased_us=$(r gw-leased '.cpu[0].us_per_decision')
plan_renew_rps=$(bench_metric "$work/gotest-renew.txt" BenchmarkRenew/holders=128 renewals/s | awk '{ printf "%.0f", $1 }')
plan_renew_item_us=$(bench_metric "$work/gotest-bench.txt" BenchmarkRenew/items=100/others=1 ns/op | awk '{ if ($1 != "") printf "%.2f", $1 / 100 / 1000 }')
# What each further holder of a quota adds to renewing one lease of it (the
# fair share is recomputed over every holder): 100 leases, 101 holders
# against 2.
renew_ns_100=$(bench_metric "$work/gotest-bench.txt" BenchmarkRenew/items=100/others=100 ns/op)
renew_ns_1=$(bench_metric "$work/gotest-bench.txt" BenchmarkRenew/items=100/others=1 ns/op)
plan_renew_holder_us=$(awk -v a="$renew_ns_100" -v b="$renew_ns_1" 'BEGIN { if (a != "" && b != "") printf "%.3f", (a - b) / 100 / 99 / 1000 }')
plan_grpc_p99=$(r light-empty '.latency_us.p99 | . + 0.5 | floor')
plan_allow_p99=$(r light-allow '.latency_us.p99 | . + 0.5 | floor')
plan_leased_p99=$(r light-leased '.latency_us.p99 | . + 0.5 | floor')
plan_rtt_p99=$(csv_field "$rtt" 7 | awk '{ printf "%.0f", $1 * 1000 }')
plan_script_us=$script_us
plan_flags="-redis-us $plan_redis_us -agent-us $plan_agent_us -agent-leased-us $plan_agent_leased_us -agent-rate $GATEWAY_RATE -renew-rps ${plan_renew_rps:-0} -renew-item-us ${plan_renew_item_us:-0} -renew-holder-us ${plan_renew_holder_us:-0} -grpc-p99-us $plan_grpc_p99 -redis-rtt-p99-us $plan_rtt_p99 -script-us $plan_script_us -allow-p99-us $plan_allow_p99 -leased-p99-us $plan_leased_p99"

table_head='| run | decisions/s | decided/s | allowed | policy | p50 µs | p99 µs | p99.9 µs | CPU µs/decision agent | redis | coordinator | servers | tool | cores busy | errors |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'
table_rows() {
  local row name what
  for row in "$@"; do
    IFS='|' read -r name what _ <<<"$row"
    jq -r --arg what "$what" '
      def cpu(i): (.cpu[i].us_per_decision // "n/a");
      def rnd: . + 0.5 | floor;
      def pct(n): if .decisions > 0 then "\((1000 * n / .decisions | floor) / 10)%" else "n/a" end;
      "| \($what) | \(.decisions_per_s) | \(.decided_per_s) | \(pct(.allowed)) | \(pct(.failure_policy)) | \(.latency_us.p50 | rnd) | \(.latency_us.p99 | rnd) | \(.latency_us.p99_9 | rnd) | \(cpu(0)) | \(cpu(1)) | \(cpu(2)) | \(.cpu_total_us_per_decision) | \(.self_cpu.us_per_decision // "n/a") | \(((.cpu_total_us_per_decision + (.self_cpu.us_per_decision // 0)) * .decisions_per_s / 1e4 | floor) / 100) | \(.errors) |"
    ' "$work/results/$name.json"
  done
}

# A hand-written record (what a change bought, with the figures of its own
# runs) follows the generated page in docs/performance.md: everything from
# the marker line on is carried over to the new page as it is.
keep_marker='<!-- bench.sh keeps everything below this line: hand-written, with the figures of its own runs -->'
kept=""
for f in "$OUT" docs/performance.md; do
  if [ -f "$f" ] && grep -qxF "$keep_marker" "$f"; then
    kept=$(awk -v m="$keep_marker" 'f || $0 == m { f = 1; print }' "$f")
    break
  fi
done

{
  cat <<EOF
# Performance

What one gateway-agent decides per second, how long a decision takes and
what it costs in CPU, on the Redis path and on the leased path, next to the
floor (an empty gRPC call) and the ceiling (Redis running the bucket script
with no agent in front). \`make bench\` (scripts/bench.sh) produces this
page; every number below comes from its last run, on the machine described.
[capacity.md](capacity.md) turns the per-decision costs at the end into a
sizing for one million decisions per second.

## Conditions

| | |
| --- | --- |
| date | $(date -u +'%Y-%m-%d %H:%M UTC') |
| code | $commit |
| machine | $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(uname -sr) |
| Go | $("$GO" env GOVERSION) |
| Redis | redis-server $redis_version (\`--save '' --appendonly no\`), on loopback |
| coordinator | one node (\`coordinator -dev\`: bootstraps alone, temporary data dir), on loopback |
| load average at start, at end | $loadavg_start; $loadavg_end |
| script run time | ${elapsed}s |

Everything runs on this one machine: ration-bench, the gateway-agent,
redis-server and the coordinator share its $(nproc) CPUs, so **the load
generator competes with what it measures** and absolute numbers are lower
than on separate machines; compare rows of one run with each other (the
ratios below), not with another machine's.
${BENCH_NOTE:+
$BENCH_NOTE
}
Each row: closed loop, $CONC concurrent callers (AllowBatch of $BIG_BATCH:
$BIG_CONC callers), $DURATION measured after a $WARMUP warmup, one agent
(\`-decision-timeout $DECISION_TIMEOUT\`: $CONC batches of $BATCH queue more
scripts at Redis than the 50ms default lets through here), one redis-server
and one coordinator. Requests carry descriptors: \`user=<key>\` for rule
\`bench\` (Redis, burst and rate 10^6, so nearly all are admitted);
\`hot=k0\` for rule \`hot\` (Redis, burst 1000 and 1000/s, so nearly all are
denied; a denial runs the same script as an admission); \`leased=<key>\`
for rule \`leased\` (\`mode: leased\`, burst and rate 10^9, \`lease: {period:
10s}\`): the agent decides from the slice it leased, in memory, and only its
background renewals reach the coordinator. A leased denial (the slice is
spent until its next refill or renewal) costs the same local check as an
admission. Each leased row uses subjects no earlier row used, so its
first decisions include the first grants. A lone agent holds the whole
quota of each leased key whatever demand it measured, and a slice that
runs dry is asked for again at once (docs/leases.md, How shares move).

## Targets and ratios

| ratio | measured | target | |
| --- | --- | --- | --- |
| unary Allow / empty unary (decided/s) | $r_allow ($allow_rate / $empty_rate) | >= 0.85 | $(verdict "$r_allow" ">=" 0.85) |
| AllowBatch decided/s / redis-benchmark pipelined ceiling (P16) | $r_batch ($batch_rate / $ceil16) | >= 0.60 | $(verdict "$r_batch" ">=" 0.60) |
| p99 of unary Allow at $CONC callers | ${allow_p99_ms} ms | < 2 ms | $(verdict "$allow_p99_ms" "<" 2) |
| leased unary Allow / Redis unary Allow (decided/s) | $r_leased_allow ($leased_rate / $allow_rate) | | |
| leased unary Allow / empty unary (decided/s) | $r_leased_empty ($leased_rate / $empty_rate) | | |
| leased AllowBatch of $BIG_BATCH / Redis AllowBatch of $BIG_BATCH (decided/s) | $r_leased_big ($leased_big_rate / $bigbatch_rate) | | |
| leased AllowBatch of $BIG_BATCH / redis-benchmark ceiling (P16) | $r_leased_big_ceil ($leased_big_rate / $ceil16) | | |
| Redis path: unary Allow / empty unary (decided/s) | $r_allow ($allow_rate / $empty_rate) | >= 0.60 | $(verdict "$r_allow" ">=" 0.60) |
| Redis path: servers' CPU per decision, Redis unary Allow / empty unary | $r16_cpu ($(srv allow) / $(srv empty) µs) | <= 1.80 | $(verdict "$r16_cpu" "<=" 1.80) |
| Envoy path: servers' CPU per decision, Envoy ShouldRateLimit / unary Allow | $r16_envoy ($(srv envoy) / $(srv allow) µs) | <= 1.10 | $(verdict "$r16_envoy" "<=" 1.10) |
| Redis path: the script's run time in Redis, one client, unpipelined (µs, \`usec_per_call\`) | $script_us | <= 8 | $(verdict "$script_us" "<=" 8) |

The same comparisons in the servers' CPU per decision (agent + redis +
coordinator, µs), which moves less than decisions/s when other work on the
machine takes a varying share of it (compare "cores busy" between rows):

| CPU per decision | ratio | µs / µs |
| --- | ---: | --- |
| Redis unary Allow / empty unary | $(ratio "$(srv allow)" "$(srv empty)") | $(srv allow) / $(srv empty) |
| leased unary Allow / empty unary | $(ratio "$(srv leased)" "$(srv empty)") | $(srv leased) / $(srv empty) |
| leased unary Allow / Redis unary Allow | $(ratio "$(srv leased)" "$(srv allow)") | $(srv leased) / $(srv allow) |
| leased AllowBatch of $BIG_BATCH / Redis AllowBatch of $BIG_BATCH | $(ratio "$(srv leased-batch-big)" "$(srv batch-big)") | $(srv leased-batch-big) / $(srv batch-big) |

All the CPU one decision costs (agent + redis + coordinator + tool) is
$cpu_empty µs for the empty call, $cpu_allow µs for a Redis-path unary Allow
and $cpu_leased µs for a leased one. When the shared CPUs are the limit,
decisions/s go inversely with these costs, so Redis unary/empty tends to
$cpu_empty / $cpu_allow = $cpu_bound here: a unary Allow adds a script run in
Redis and a Redis round trip in the agent that the empty call does not have.
The 0.85 target measures the agent itself only with Redis and the load
generator on other cores. A leased unary Allow costs about what the empty
call costs: the gRPC call is the decision's price, the leased check itself
is the tens of nanoseconds of the in-process benchmark below.

## Results

"decided/s" counts only what a rule's bucket (or leased slice) decided: not
errors and not answers of a failure policy (store unreachable or slower
than the decision timeout), whose share is the "policy" column; the ratios
above use it. Latency is per call: one decision, except AllowBatch rows,
where a call carries $BATCH or $BIG_BATCH decisions (its amortized latency
per decision is in the JSON report). CPU is utime+stime from /proc over the
measured window divided by the decisions: "servers" is agent + redis +
coordinator, "tool" is ration-bench itself, and "cores busy" is all of them
times decisions/s: near $(nproc), the row was bound by this machine's CPUs
rather than by any one component.

$table_head
$(table_rows "${matrix[@]}")

### One gateway's load

Open loop at $GATEWAY_RATE decisions/s, one gateway's share of the capacity
plan's example (10^6/s over 200 gateways): what the agent's CPU per
decision is at that rate (calls too sparse to share wake-ups and syscalls
the way they do in a saturated agent, so it is higher than above).

$table_head
$(table_rows "${gateway[@]}")

### Latency at a light load: where a decision's time goes

The same agent, driven open loop at $LIGHT_RATE decisions/s (latency counted
from the intended send time, so a stall is not hidden), for $LIGHT_DURATION after
a $WARMUP warmup: the machine is mostly idle, so these are the costs of the
parts, not of queueing. Next to them, the Redis round trip alone:
redis-benchmark with one client and one script at a time, and the
script's own run time inside Redis (\`usec_per_call\` of \`cmdstat_evalsha\`
in \`INFO commandstats\`, reset before that run; a mean).

$table_head
$(table_rows "${light[@]}")

| Redis alone | requests/s | p50 µs | p99 µs | script µs/call (mean, inside Redis) |
| --- | ---: | ---: | ---: | ---: |
| EVALSHA, 1 client, no pipelining | $(csv_field "$rtt" 2 | awk '{ printf "%.0f", $1 }') | $(csv_field "$rtt" 5 | awk '{ printf "%.0f", $1 * 1000 }') | $plan_rtt_p99 | $script_us |

## The Redis ceiling

redis-benchmark, $CONC clients, EVALSHA of the agent's own script
(\`$script\`, SHA1 \`$sha\`) with the agent's arguments for rule \`bench\`,
on $KEYS random keys, no agent in between (\`-n\` sized by a 20,000-request
probe to run about $DURATION). The agent pipelines a whole batch per round
trip, deeper than the ceiling's 16. "redis CPU" is redis-server's
utime+stime over the run divided by the scripts: one shard is one core, so
10^6 / that is what one shard runs per second once its core is the limit.

| pipeline | requests/s | p50 ms | p99 ms | redis CPU µs/script |
| --- | ---: | ---: | ---: | ---: |
| 1 | $ceil1 | $(csv_field "${ceiling[1]}" 5) | $(csv_field "${ceiling[1]}" 7) | ${ceiling_us[1]} |
| 16 | $ceil16 | $(csv_field "${ceiling[16]}" 5) | $(csv_field "${ceiling[16]}" 7) | ${ceiling_us[16]} |

## Go benchmarks

### The leased decision, in process

No gRPC, no network: \`Leases.Take\` on a lease held from a real (embedded,
one-node) coordinator, on one and on two cores (\`-cpu 1,2\`; names without a
suffix ran on one core).

\`$leased_cmd\`

\`\`\`text
$(bench_lines "$work/gotest-leased.txt")
\`\`\`

### Renewals per second of a 3-node coordinator group

Three coordinator nodes (Raft over loopback TCP, BoltDB on temporary dirs)
and the holders' clients, all in one process on this machine's $(nproc) CPUs.
One op is one \`Renew\` request carrying one lease; "requests/entry" is how
many requests the leader's batcher put in one Raft entry.

\`$renew_cmd\`

\`\`\`text
$(bench_lines "$work/gotest-renew.txt")
\`\`\`

### Everything else

\`$gotest_cmd\`

\`\`\`text
$(bench_lines "$work/gotest-bench.txt")
\`\`\`
$(if [ "$gotest_status" -ne 0 ]; then echo; echo "**a go test -bench run failed (exit $gotest_status)**: see above; the other results are still shown."; fi)

## Per-decision costs for the capacity plan

[capacity.md](capacity.md) sizes a deployment from these figures of this
run; \`ration-bench plan\` takes them as flags:

| flag | value | from |
| --- | ---: | --- |
| \`-redis-us\` | $plan_redis_us | redis-server CPU µs per script, redis-benchmark P1 with $CONC clients (the ceiling table) |
| \`-agent-us\` | $plan_agent_us | agent CPU µs per decision, unary Allow at $GATEWAY_RATE/s (one gateway's load; $(r allow '.cpu[0].us_per_decision') when saturated) |
| \`-agent-leased-us\` | $plan_agent_leased_us | agent CPU µs per decision, leased unary Allow at $GATEWAY_RATE/s ($(r leased '.cpu[0].us_per_decision') when saturated) |
| \`-agent-rate\` | $GATEWAY_RATE | the rate of the two rows above (BENCH_GATEWAY_RATE) |
| \`-renew-rps\` | ${plan_renew_rps:-n/a} | Renew requests/s of the 3-node group, \`BenchmarkRenew/holders=128\` |
| \`-renew-item-us\` | ${plan_renew_item_us:-n/a} | state-machine µs per lease in a Renew (its quota held by 2 agents), \`internal/lease\` \`BenchmarkRenew/items=100/others=1\` ns/op / 100 |
| \`-renew-holder-us\` | ${plan_renew_holder_us:-n/a} | what each further holder of its quota adds to one lease's renewal: (\`others=100\` ns/op - \`others=1\` ns/op) / 100 leases / 99 holders |
| \`-grpc-p99-us\` | $plan_grpc_p99 | p99 of the empty unary call at $LIGHT_RATE/s |
| \`-redis-rtt-p99-us\` | $plan_rtt_p99 | p99 of EVALSHA from one client, no pipelining |
| \`-script-us\` | $plan_script_us | the script's mean run time inside Redis |
| \`-allow-p99-us\` | $plan_allow_p99 | p99 of unary Allow (Redis path) at $LIGHT_RATE/s |
| \`-leased-p99-us\` | $plan_leased_p99 | p99 of unary Allow (leased) at $LIGHT_RATE/s |

\`\`\`sh
ration-bench plan $plan_flags
\`\`\`

## Reproduce

\`\`\`sh
make bench        # or ./scripts/bench.sh; BENCH_OUT=/tmp/p.md to write elsewhere
\`\`\`

The script runs, on free loopback ports, with \`\$GRPC\`/\`\$HTTP\` the
agent's addresses and \`\$COORD\` the coordinator's gRPC address (read from
their logs) and \`\$AGENT_PID\`/\`\$REDIS_PID\`/\`\$COORD_PID\` the three
processes:

\`\`\`sh
redis-server --port \$REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy noeviction
coordinator -dev -rules rules.yaml -raft 127.0.0.1:0 -grpc 127.0.0.1:0 -http 127.0.0.1:0
gateway-agent -rules rules.yaml -redis 127.0.0.1:\$REDIS_PORT -coordinators \$COORD -insecure -grpc 127.0.0.1:0 -http 127.0.0.1:0 -decision-timeout $DECISION_TIMEOUT
EOF
  for row in "${matrix[@]}" "${gateway[@]}" "${light[@]}"; do
    IFS='|' read -r _ _ flags <<<"$row"
    echo "ration-bench -duration $DURATION -warmup $WARMUP -pids \$AGENT_PID,\$REDIS_PID,\$COORD_PID -json $flags"
  done
  echo "redis-cli -p \$REDIS_PORT -x SCRIPT LOAD < $script   # prints \$SHA"
  echo "${ceiling_cmd[1]}"
  echo "${ceiling_cmd[16]}"
  echo "redis-cli -p \$REDIS_PORT CONFIG RESETSTAT"
  echo "$rtt_cmd"
  echo "redis-cli -p \$REDIS_PORT INFO commandstats   # cmdstat_evalsha usec_per_call"
  echo "$leased_cmd"
  echo "$renew_cmd"
  echo "$gotest_cmd"
  echo '```'
  echo
  echo 'with this rules.yaml (given to the agent and to the coordinator):'
  echo
  echo '```yaml'
  cat "$work/rules.yaml"
  echo '```'
  if [ -n "$kept" ]; then
    echo
    printf '%s\n' "$kept"
  fi
} >"$OUT"
say "wrote $OUT (${elapsed}s)"
if [ "$gotest_status" -ne 0 ]; then die "go test -bench failed (exit $gotest_status); the rest of the run is in $OUT"; fi
