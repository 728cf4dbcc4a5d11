#!/usr/bin/env bash
# Ration's reproducible benchmark run (make bench). On loopback only, bounded
# in time (about 3 minutes), it
#   1. runs the Go benchmarks (go test -bench) of every package that has any;
#   2. starts its own redis-server on a free port (never 6379; no persistence)
#      and a gateway-agent built from this tree, with rules it writes;
#   3. drives the agent with cmd/ration-bench: the empty gRPC call (floor),
#      unary Allow, AllowBatch, AllowStream and HTTP check, on 10k keys and on
#      one hot key, with the CPU of the agent and of Redis per decision;
#   4. measures the Redis ceiling: redis-benchmark running EVALSHA of the
#      agent's own script (internal/bucket/redis.lua) at pipeline 1 and 16;
#   5. writes docs/performance.md (BENCH_OUT to write elsewhere).
#
# Knobs (environment): BENCH_DURATION (5s), BENCH_WARMUP (1s),
# BENCH_CONCURRENCY (64), BENCH_KEYS (10000), BENCH_BATCH (100),
# BENCH_GO_BENCHTIME (1s), BENCH_DECISION_TIMEOUT (1s: the agent's
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
GO_BENCHTIME=${BENCH_GO_BENCHTIME:-1s}
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

# 2. redis-server, gateway-agent ------------------------------------------
say "building gateway-agent and ration-bench"
"$GO" build -o "$work/bin/gateway-agent" ./cmd/gateway-agent
"$GO" build -o "$work/bin/ration-bench" ./cmd/ration-bench
bench="$work/bin/ration-bench"

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

redis_port=""
for _ in $(seq 20); do
  p=$((20000 + RANDOM % 40000))
  port_in_use "$p" && continue
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --maxmemory-policy noeviction --dir "$work" --logfile "$work/redis.log" &
  rpid=$!
  for _ in $(seq 50); do
    if [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ]; then redis_port=$p; break; fi
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -n "$redis_port" ]; then procs+=("$rpid"); break; fi
  kill "$rpid" 2>/dev/null || true; wait "$rpid" 2>/dev/null || true
done
[ -n "$redis_port" ] || die "could not start redis-server on a free port (see $work/redis.log)"
redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
say "redis-server $redis_version on 127.0.0.1:$redis_port (pid $rpid)"

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
EOF

"$work/bin/gateway-agent" -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" \
  -grpc 127.0.0.1:0 -http 127.0.0.1:0 -id bench -log-level info -decision-timeout "$DECISION_TIMEOUT" \
  2>"$work/agent.log" &
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
common="-duration $DURATION -warmup $WARMUP -concurrency $CONC -pids $apid,$rpid -json"
# name | what it is | flags (GRPC and HTTP are expanded when run)
matrix=(
  "empty|empty unary (grpc.health.v1 Check): the floor|-mode empty -target \$GRPC"
  "allow|unary Allow, $KEYS keys uniform|-mode allow -target \$GRPC -keys $KEYS -dist uniform"
  "allow-hot|unary Allow, 1 hot key (over its limit)|-mode allow -target \$GRPC -descriptor-key hot -dist hot"
  "batch|AllowBatch of $BATCH, $KEYS keys uniform|-mode batch -batch $BATCH -target \$GRPC -keys $KEYS -dist uniform"
  "batch-hot|AllowBatch of $BATCH, 1 hot key (over its limit)|-mode batch -batch $BATCH -target \$GRPC -descriptor-key hot -dist hot"
  "stream|AllowStream, $KEYS keys uniform|-mode stream -target \$GRPC -keys $KEYS -dist uniform"
  "http|HTTP GET /v1/check, $KEYS keys uniform|-mode http -http-target \$HTTP -keys $KEYS -dist uniform"
)
for row in "${matrix[@]}"; do
  IFS='|' read -r name _ flags <<<"$row"
  expanded=${flags//\$GRPC/$GRPC}
  expanded=${expanded//\$HTTP/$HTTP}
  say "ration-bench $flags $common"
  # shellcheck disable=SC2086 # flags are words
  "$bench" $expanded $common >"$work/results/$name.json"
  jq -r '"   \(.decisions_per_s) decisions/s (\(.decided_per_s) decided by a bucket), p50 \(.latency_us.p50)µs, p99 \(.latency_us.p99)µs, failure policy \(.failure_policy), errors \(.errors)"' \
    "$work/results/$name.json" >&2
done

# 4. the Redis ceiling: redis-benchmark running the agent's own script ----
script=internal/bucket/redis.lua
sha=$(redis-cli -p "$redis_port" -x SCRIPT LOAD <"$script")
[ "$sha" = "$(sha1sum "$script" | cut -d' ' -f1)" ] || die "SCRIPT LOAD answered $sha, not the SHA1 of $script"
# The agent's call for rule bench: KEYS[1] = bucket, ARGV = op, burst, rate,
# cost, request-id TTL (ms), numbers as the agent formats them.
evalsha=(EVALSHA "$sha" 1 'ration:{bench|user=k__rand_int__}' take 1e+06 1e+06 1 600000)
rb() { # rb PIPELINE N: one CSV line of results
  timeout 120 redis-benchmark -h 127.0.0.1 -p "$redis_port" -c "$CONC" -n "$2" -P "$1" -r "$KEYS" --csv "${evalsha[@]}" | tail -1
}
declare -A ceiling
declare -a ceiling_cmd
for pipe in 1 16; do
  # A short probe sizes the run to about the matrix's duration.
  probe=$(rb "$pipe" 20000 | awk -F'","' '{print $2}')
  secs=$(awk -v d="$DURATION" 'BEGIN { sub(/s$/, "", d); print d + 0 }')
  n=$(awk -v r="$probe" -v s="$secs" 'BEGIN { n = int(r * s); if (n < 50000) n = 50000; print n }')
  say "redis-benchmark -c $CONC -n $n -P $pipe -r $KEYS --csv ${evalsha[*]}"
  line=$(rb "$pipe" "$n")
  ceiling[$pipe]=$line
  echo "   $line" >&2
  ceiling_cmd[$pipe]="redis-benchmark -h 127.0.0.1 -p \$REDIS_PORT -c $CONC -n $n -P $pipe -r $KEYS --csv EVALSHA \$SHA 1 'ration:{bench|user=k__rand_int__}' take 1e+06 1e+06 1 600000"
done
csv_field() { awk -F'","' -v i="$2" '{ gsub(/^"|"$/, ""); print $i }' <<<"$1"; }

# 5. docs/performance.md ----------------------------------------------------
r() { jq -r "$2" "$work/results/$1.json"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
verdict() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN { ok = (op == ">=") ? (v >= t) : (v < t); print ok ? "met" : "**not met**" }'; }

empty_rate=$(r empty .decisions_per_s)
allow_rate=$(r allow .decided_per_s)
batch_rate=$(r batch .decided_per_s)
ceil16=$(csv_field "${ceiling[16]}" 2 | awk '{ printf "%.0f", $1 }')
ceil1=$(csv_field "${ceiling[1]}" 2 | awk '{ printf "%.0f", $1 }')
allow_p99_ms=$(awk -v us="$(r allow .latency_us.p99)" 'BEGIN { printf "%.2f", us / 1000 }')
r_allow=$(ratio "$allow_rate" "$empty_rate")
r_batch=$(ratio "$batch_rate" "$ceil16")
elapsed=$(( $(date +%s) - script_start ))
# All CPU one decision costs (agent, redis, tool): when the three share the
# CPUs and keep them busy, decisions/s ratios follow these costs.
cpu_all() { r "$1" '.cpu_total_us_per_decision + (.self_cpu.us_per_decision // 0)'; }
cpu_empty=$(cpu_all empty)
cpu_allow=$(cpu_all allow)
cpu_bound=$(ratio "$cpu_empty" "$cpu_allow")

{
  cat <<EOF
# Performance

What one gateway-agent decides per second, how long a decision takes and
what it costs in CPU, next to the floor (an empty gRPC call) and the ceiling
(Redis running the bucket script with no agent in front). \`make bench\`
(scripts/bench.sh) produces this page; every number below comes from its
last run, on the machine described.

## Conditions

| | |
| --- | --- |
| date | $(date -u +'%Y-%m-%d %H:%M UTC') |
| code | $commit |
| machine | $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(uname -sr) |
| Go | $("$GO" env GOVERSION) |
| Redis | redis-server $redis_version (\`--save '' --appendonly no\`), on loopback |
| load average at start | $loadavg_start |
| script run time | ${elapsed}s |

Everything runs on this one machine: ration-bench, the gateway-agent and
redis-server share its $(nproc) CPUs, so **the load generator competes with
what it measures** and absolute numbers are lower than on separate machines;
compare rows of one run with each other, not with another machine's.
${BENCH_NOTE:+
$BENCH_NOTE
}
Each row: closed loop, $CONC concurrent callers, $DURATION measured after a
$WARMUP warmup, one agent (Redis path, \`-decision-timeout $DECISION_TIMEOUT\`: $CONC
batches of $BATCH queue more scripts at Redis than the 50ms default lets
through here) and one redis-server. Requests carry descriptors (\`user=<key>\` for rule \`bench\`,
burst and rate 10^6, so nearly all are admitted; \`hot=k0\` for rule \`hot\`,
burst 1000 and 1000/s, so nearly all are denied; a denial runs the same
script as an admission).

## Targets

| ratio | measured | target | |
| --- | --- | --- | --- |
| unary Allow / empty unary (decided/s) | $r_allow ($allow_rate / $empty_rate) | >= 0.85 | $(verdict "$r_allow" ">=" 0.85) |
| AllowBatch decided/s / redis-benchmark pipelined ceiling (P16) | $r_batch ($batch_rate / $ceil16) | >= 0.60 | $(verdict "$r_batch" ">=" 0.60) |
| p99 of unary Allow at $CONC callers | ${allow_p99_ms} ms | < 2 ms | $(verdict "$allow_p99_ms" "<" 2) |

All the CPU one decision costs (agent + redis + tool) is $cpu_empty µs for the
empty call and $cpu_allow µs for unary Allow. When the shared CPUs are the
limit, decisions/s go inversely with these costs, so unary/empty tends to
$cpu_empty / $cpu_allow = $cpu_bound here: a unary Allow adds a script run in
Redis and a Redis round trip in the agent that the empty call does not have.
The 0.85 target measures the agent itself only with Redis and the load
generator on other cores.

## Results

"decided/s" counts only what a rule's bucket decided: not errors and not
answers of a failure policy (store unreachable or slower than the decision
timeout), whose share is the "policy" column; the ratios above use it.
Latency is per call: one decision, except AllowBatch rows, where a call
carries $BATCH decisions (its amortized latency per decision is in the JSON
report). CPU is utime+stime from /proc over the measured window divided by
the decisions; "tool" is ration-bench itself, and "cores busy" is all three
together (agent, redis, tool) times decisions/s: near $(nproc), the row was
bound by this machine's CPUs rather than by any one component.

| run | decisions/s | decided/s | allowed | policy | p50 µs | p99 µs | p99.9 µs | CPU µs/decision agent | redis | agent+redis | tool | cores busy | errors |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
EOF
  for row in "${matrix[@]}"; do
    IFS='|' read -r name what _ <<<"$row"
    jq -r --arg what "$what" '
      def cpu(i): (.cpu[i].us_per_decision // "n/a");
      def rnd: . + 0.5 | floor;
      def pct(n): if .decisions > 0 then "\((1000 * n / .decisions | floor) / 10)%" else "n/a" end;
      "| \($what) | \(.decisions_per_s) | \(.decided_per_s) | \(pct(.allowed)) | \(pct(.failure_policy)) | \(.latency_us.p50 | rnd) | \(.latency_us.p99 | rnd) | \(.latency_us.p99_9 | rnd) | \(cpu(0)) | \(cpu(1)) | \(.cpu_total_us_per_decision) | \(.self_cpu.us_per_decision // "n/a") | \(((.cpu_total_us_per_decision + (.self_cpu.us_per_decision // 0)) * .decisions_per_s / 1e4 | floor) / 100) | \(.errors) |"
    ' "$work/results/$name.json"
  done
  cat <<EOF

The Redis ceiling: redis-benchmark, $CONC clients, EVALSHA of the agent's
own script (\`$script\`, SHA1 \`$sha\`) with the agent's arguments for rule
\`bench\`, on $KEYS random keys, no agent in between (\`-n\` sized by a
20,000-request probe to run about $DURATION). The agent pipelines a whole
batch ($BATCH scripts) per round trip, deeper than the ceiling's 16:

| pipeline | requests/s | p50 ms | p99 ms |
| --- | ---: | ---: | ---: |
| 1 | $ceil1 | $(csv_field "${ceiling[1]}" 5) | $(csv_field "${ceiling[1]}" 7) |
| 16 | $ceil16 | $(csv_field "${ceiling[16]}" 5) | $(csv_field "${ceiling[16]}" 7) |

## Go benchmarks

\`$gotest_cmd\`

\`\`\`text
$(bench_lines "$work/gotest-bench.txt")
\`\`\`
$(if [ "$gotest_status" -ne 0 ]; then echo; echo "**go test -bench exited $gotest_status**: a benchmark failed (above); its package's other results are still shown."; fi)

## Reproduce

\`\`\`sh
make bench        # or ./scripts/bench.sh; BENCH_OUT=/tmp/p.md to write elsewhere
\`\`\`

The script runs, on a free loopback port \`\$REDIS_PORT\`, with \`\$GRPC\`/\`\$HTTP\`
the agent's addresses (read from its log) and \`\$AGENT_PID\`/\`\$REDIS_PID\`
the two processes:

\`\`\`sh
redis-server --port \$REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy noeviction
gateway-agent -rules rules.yaml -redis 127.0.0.1:\$REDIS_PORT -grpc 127.0.0.1:0 -http 127.0.0.1:0 -decision-timeout $DECISION_TIMEOUT
EOF
  for row in "${matrix[@]}"; do
    IFS='|' read -r _ _ flags <<<"$row"
    echo "ration-bench $flags -duration $DURATION -warmup $WARMUP -concurrency $CONC -pids \$AGENT_PID,\$REDIS_PID -json"
  done
  echo "redis-cli -p \$REDIS_PORT -x SCRIPT LOAD < $script   # prints \$SHA"
  echo "${ceiling_cmd[1]}"
  echo "${ceiling_cmd[16]}"
  echo '```'
  echo
  echo 'with this rules.yaml:'
  echo
  echo '```yaml'
  cat "$work/rules.yaml"
  echo '```'
} >"$OUT"
say "wrote $OUT (${elapsed}s)"
if [ "$gotest_status" -ne 0 ]; then die "go test -bench failed (exit $gotest_status); the rest of the run is in $OUT"; fi
