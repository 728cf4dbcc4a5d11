#!/usr/bin/env bash
# What TLS costs (make bench-tls): decisions/s, latency and CPU per decision
# of a gateway-agent whose gRPC and HTTP listeners are plaintext, TLS
# (-listen-tls) or mutual TLS (-listen-client-auth), and renewals/s of a
# 3-node coordinator group in plaintext and over mutual TLS. On loopback
# only, bounded in time (about 5 minutes with the defaults), it
#   1. writes a development PKI to its work directory
#      (internal/certgen/ration-certs): a CA, the coordinator's certificate,
#      one per agent and one for the gateway (ration-bench);
#   2. starts its own redis-server on a free port (never 6379; no
#      persistence), a one-node coordinator (coordinator -dev, with TLS)
#      and three gateway-agents built from this tree, identical but for
#      their listeners: plaintext, -listen-tls, -listen-tls
#      -listen-client-auth (all three reach the coordinator over mutual TLS,
#      so that only the listener differs);
#   3. drives them with cmd/ration-bench, closed loop, in many short rounds
#      (the load of a shared machine drifts between rounds by more than
#      TLS costs; it is compared within a round): for each
#      call (the empty gRPC call, unary Allow on the Redis path, unary
#      Allow on the leased path, HTTP GET /v1/check on the Redis path) the
#      three agents take turns, in the opposite order in every other round,
#      so that a drift in the machine's load weighs on all three alike;
#      with the CPU of the agent, redis-server and the coordinator per
#      decision;
#      Then, with them stopped, BenchmarkListenerTLS (cmd/ration-bench):
#      the same listeners in one process, taking turns every 100ms, for the
#      CPU a call costs at both ends, which that noise hides between rows;
#   4. runs BenchmarkLeasesOverTLS (internal/coordinator):
#      renewals/s, p50/p99 and CPU per renewal of a 3-node group in
#      plaintext and with mutual TLS on every link, for 16 and 128
#      holders, the two links taking turns the same way;
#   5. writes the tables, the ratios to plaintext and the commands between
#      the bench-tls markers of docs/performance.md's TLS section
#      (BENCH_TLS_OUT to write elsewhere; the markers and a heading are
#      appended when the file has none). The text around the markers is
#      hand-written and left alone.
#
# Nothing is pinned to a CPU (scripts/bench.sh does not pin either): the
# load generator shares the machine's CPUs with what it measures, so
# compare the rows of one run with each other, not with another machine's.
#
# Knobs (environment): BENCH_TLS_DURATION (2s per row), BENCH_TLS_WARMUP
# (500ms), BENCH_TLS_ROUNDS (4), BENCH_TLS_CONCURRENCY (64), BENCH_TLS_KEYS
# (10000), BENCH_TLS_LISTENER_ROUNDS (60 rounds of BenchmarkListenerTLS),
# BENCH_TLS_RENEW_BENCHTIME (2s), BENCH_TLS_RENEW_ROUNDS (3),
# BENCH_TLS_OUT (docs/performance.md), BENCH_NOTE (a sentence about the
# conditions), BENCH_COMMIT (names the code measured when this is not a git
# checkout), BENCH_KEEP=1 keeps the work directory (JSON reports, logs).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_TLS_DURATION:-2s}
WARMUP=${BENCH_TLS_WARMUP:-500ms}
ROUNDS=${BENCH_TLS_ROUNDS:-4}
CONC=${BENCH_TLS_CONCURRENCY:-64}
KEYS=${BENCH_TLS_KEYS:-10000}
RENEW_BENCHTIME=${BENCH_TLS_RENEW_BENCHTIME:-2s}
RENEW_ROUNDS=${BENCH_TLS_RENEW_ROUNDS:-3}
LISTENER_ROUNDS=${BENCH_TLS_LISTENER_ROUNDS:-60}
# As in scripts/bench.sh: the benchmark measures throughput, so a decision
# may wait on Redis longer than the 50ms default before the failure policy.
DECISION_TIMEOUT=1s
OUT=${BENCH_TLS_OUT:-docs/performance.md}
GO=${GO:-go}

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench-tls.sh: %s\n' "$*" >&2; exit 1; }

for cmd in redis-server redis-cli jq awk "$GO"; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is missing (make deps installs redis; jq: apt-get install jq)"
done
[[ "$ROUNDS" =~ ^[1-9][0-9]?$ && "$RENEW_ROUNDS" =~ ^[1-9][0-9]?$ && "$LISTENER_ROUNDS" =~ ^[1-9][0-9]{0,2}$ ]] ||
  die "BENCH_TLS_ROUNDS and BENCH_TLS_RENEW_ROUNDS: 1 to 99; BENCH_TLS_LISTENER_ROUNDS: 1 to 999"

work=$(mktemp -d "${TMPDIR:-/tmp}/ration-bench-tls.XXXXXX")
mkdir -p "$work/bin" "$work/results"
procs=()
stop_procs() {
  local p
  for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${procs[@]}"; do wait "$p" 2>/dev/null || true; done
  procs=()
}
cleanup() {
  stop_procs
  if [ "${BENCH_KEEP:-0}" = 1 ]; then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

script_start=$(date +%s)
loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit with uncommitted changes"
else
  commit=${BENCH_COMMIT:-unknown (not a git checkout)}
fi

# 1. binaries and the PKI ---------------------------------------------------
say "building gateway-agent, coordinator, ration-bench, ration-certs and the coordinator tests"
"$GO" build -o "$work/bin/gateway-agent" ./cmd/gateway-agent
"$GO" build -o "$work/bin/coordinator" ./cmd/coordinator
"$GO" build -o "$work/bin/ration-bench" ./cmd/ration-bench
"$GO" build -o "$work/bin/ration-certs" ./internal/certgen/ration-certs
"$GO" test -c -o "$work/bin/coordinator.test" ./internal/coordinator
"$GO" test -c -o "$work/bin/ration-bench.test" ./cmd/ration-bench
bench="$work/bin/ration-bench"
certs="$work/certs"
"$work/bin/ration-certs" -out "$certs" -coordinators dev -agents plain,tls,mtls -gateways bench -operators '' \
  -hosts localhost,127.0.0.1 -validity 24h >/dev/null

# 2. redis-server, coordinator, three agents --------------------------------
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
  # Leased: decided in the agent's memory from a slice leased from the
  # coordinator. Burst and rate are far above what this machine can ask
  # for, so the slice, not the rule, is the limit.
  - name: leased
    match: {leased: "*"}
    burst: 1000000000
    rate: 1000000000
    mode: leased
    on_failure: fail_closed
    lease: {period: 10s}
EOF

# wait_log FILE TEXT PID WHAT: until FILE holds TEXT (10s).
wait_log() {
  for _ in $(seq 100); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { cat "$1" >&2; die "$4 exited"; }
    sleep 0.1
  done
  cat "$1" >&2
  die "$4 not ready after 10s"
}

"$work/bin/coordinator" -dev -rules "$work/rules.yaml" -raft 127.0.0.1:0 -grpc 127.0.0.1:0 -http 127.0.0.1:0 -admin 127.0.0.1:0 \
  -tls-cert "$certs/coordinator-dev.crt" -tls-key "$certs/coordinator-dev.key" -tls-ca "$certs/ca.crt" \
  2>"$work/coordinator.log" &
cpid=$!
procs+=("$cpid")
wait_log "$work/coordinator.log" 'leader ready' "$cpid" coordinator
COORD=$(sed -n 's/.*coordinator started.* grpc_addr=\([^ ]*\).*/\1/p' "$work/coordinator.log" | head -1)
[ -n "$COORD" ] || die "could not read the coordinator's gRPC address from its log"
say "coordinator -dev (mutual TLS) on grpc $COORD (pid $cpid)"

# The three listener set-ups: name | agent flags | ration-bench flags.
configs=(
  "plain||"
  "tls|-listen-tls|-tls-ca $certs/ca.crt"
  "mtls|-listen-tls -listen-client-auth|-tls-ca $certs/ca.crt -tls-cert $certs/gateway-bench.crt -tls-key $certs/gateway-bench.key"
)
# The gateway's certificate names ration://gateway/bench: an agent with
# -listen-client-auth admits only gateways' certificates.
declare -A apid grpc_addr http_addr bflags
for row in "${configs[@]}"; do
  IFS='|' read -r name aflags bf <<<"$row"
  # shellcheck disable=SC2086 # aflags are separate flags
  "$work/bin/gateway-agent" -rules "$work/rules.yaml" -redis "127.0.0.1:$redis_port" \
    -coordinators "$COORD" -grpc 127.0.0.1:0 -http 127.0.0.1:0 -id "$name" -log-level info \
    -decision-timeout "$DECISION_TIMEOUT" \
    -tls-cert "$certs/agent-$name.crt" -tls-key "$certs/agent-$name.key" -tls-ca "$certs/ca.crt" $aflags \
    2>"$work/agent-$name.log" &
  apid[$name]=$!
  procs+=("${apid[$name]}")
  bflags[$name]=$bf
done
for row in "${configs[@]}"; do
  IFS='|' read -r name aflags _ <<<"$row"
  wait_log "$work/agent-$name.log" 'store answered: ready' "${apid[$name]}" "gateway-agent $name"
  grpc_addr[$name]=$(sed -n 's/.*gateway-agent started.* grpc=\([^ ]*\).*/\1/p' "$work/agent-$name.log" | head -1)
  http_addr[$name]=$(sed -n 's/.*gateway-agent started.* http=\([^ ]*\).*/\1/p' "$work/agent-$name.log" | head -1)
  [ -n "${grpc_addr[$name]}" ] && [ -n "${http_addr[$name]}" ] || die "could not read agent $name's addresses from its log"
  say "gateway-agent $name ${aflags:-(plaintext listeners)} on grpc ${grpc_addr[$name]}, http ${http_addr[$name]} (pid ${apid[$name]})"
done

# 3. the agent rows -----------------------------------------------------------
C="-concurrency $CONC"
# name | what it is | flags (GRPC, HTTP and PREFIX are expanded per agent)
calls=(
  "empty|empty unary (grpc.health.v1 Check)|-mode empty -target \$GRPC $C"
  "allow|unary Allow, Redis path, $KEYS keys uniform|-mode allow -target \$GRPC -keys $KEYS -dist uniform $C"
  "leased|unary Allow, leased path, 1 hot key|-mode allow -target \$GRPC -descriptor-key leased -key-prefix \$PREFIX -dist hot $C"
  "http|HTTP GET /v1/check, Redis path, $KEYS keys uniform|-mode http -http-target \$HTTP -keys $KEYS -dist uniform $C"
)
names=(plain tls mtls)
common="-duration $DURATION -warmup $WARMUP -json"
# One TSV line per row: call, listener, round, then the report's figures.
tsv="$work/rows.tsv"
: >"$tsv"
for round in $(seq "$ROUNDS"); do
  order=("${names[@]}")
  if [ $((round % 2)) -eq 0 ]; then order=(mtls tls plain); fi
  for call in "${calls[@]}"; do
    IFS='|' read -r cname _ flags <<<"$call"
    for name in "${order[@]}"; do
      GRPC=${grpc_addr[$name]} HTTP=${http_addr[$name]} PREFIX="l$name$round-"
      expanded=${flags//\$GRPC/$GRPC}
      expanded=${expanded//\$HTTP/$HTTP}
      expanded=${expanded//\$PREFIX/$PREFIX}
      out="$work/results/$cname-$name-$round.json"
      say "round $round, $cname, $name: ration-bench $common -pids ${apid[$name]},$rpid,$cpid $expanded ${bflags[$name]}"
      # shellcheck disable=SC2086 # flags are separate words
      "$bench" $common -pids "${apid[$name]},$rpid,$cpid" $expanded ${bflags[$name]} >"$out"
      jq -r --arg c "$cname" --arg n "$name" --arg r "$round" '
        def cpu(i): (.cpu[i].us_per_decision // 0);
        [$c, $n, $r, .decisions_per_s, .decided_per_s, .latency_us.p50, .latency_us.p99, cpu(0), cpu(1), cpu(2),
         .cpu_total_us_per_decision, (.self_cpu.us_per_decision // 0), .errors, .failure_policy, (.tls // "plaintext")] | @tsv' "$out" >>"$tsv"
      jq -r '"   \(.decisions_per_s) decisions/s (\(.decided_per_s) decided), p50 \(.latency_us.p50)µs, p99 \(.latency_us.p99)µs, agent \(.cpu[0].us_per_decision)µs/decision, errors \(.errors)"' "$out" >&2
    done
  done
done
# What the connections negotiated (ration-bench's report).
tls_neg=$(awk -F'\t' '$2 == "tls" && $1 != "http" { print $15; exit }' "$tsv")
mtls_neg=$(awk -F'\t' '$2 == "mtls" && $1 != "http" { print $15; exit }' "$tsv")
https_neg=$(awk -F'\t' '$2 == "tls" && $1 == "http" { print $15; exit }' "$tsv")
stop_procs

# 3b. the same calls finely interleaved, in one process -----------------------
# BenchmarkListenerTLS (cmd/ration-bench): three in-process agents (memory
# store) and ration-bench's own callers take turns in 100ms slices; the CPU
# of both ends of a call, whose differences between listeners the load of
# this machine hides in the rows above.
listener_cmd="go test -run '^\$' -bench ListenerTLS -benchtime ${LISTENER_ROUNDS}x -count 1 ./cmd/ration-bench/"
say "$listener_cmd"
listener_status=0
(cd cmd/ration-bench && "$work/bin/ration-bench.test" -test.run '^$' -test.bench ListenerTLS \
  -test.benchtime "${LISTENER_ROUNDS}x" -test.count 1 -test.timeout 5m) >"$work/results/listener.txt" 2>&1 || listener_status=$?
grep -E '^BenchmarkListenerTLS' "$work/results/listener.txt" >&2 || { tail -20 "$work/results/listener.txt" >&2; listener_status=1; }

# 4. renewals over mutual TLS -------------------------------------------------
renew_tsv="$work/renew.tsv"
: >"$renew_tsv"
renew_status=0
renew_cmds=()
for round in $(seq "$RENEW_ROUNDS"); do
  links=(plaintext mtls)
  if [ $((round % 2)) -eq 0 ]; then links=(mtls plaintext); fi
  for holders in 16 128; do
    for link in "${links[@]}"; do
      pattern="^BenchmarkLeasesOverTLS\$/^holders=$holders\$/^link=$link\$"
      cmdline="go test -run '^\$' -bench '$pattern' -benchtime $RENEW_BENCHTIME -count 1 ./internal/coordinator/"
      if [ "$round" -eq 1 ]; then renew_cmds+=("$cmdline"); fi
      say "round $round: $cmdline"
      log="$work/results/renew-$holders-$link-$round.txt"
      (cd internal/coordinator && "$work/bin/coordinator.test" -test.run '^$' -test.bench "$pattern" \
        -test.benchtime "$RENEW_BENCHTIME" -test.count 1 -test.timeout 5m) >"$log" 2>&1 || renew_status=$?
      line=$(grep -E "^BenchmarkLeasesOverTLS/holders=$holders/link=$link(-[0-9]+)?[[:space:]]" "$log" | tail -1 || true)
      if [ -z "$line" ]; then
        grep -E '^(--- FAIL|    )' "$log" | head -20 >&2 || true
        say "no result for holders=$holders link=$link (see above)"
        renew_status=1
        continue
      fi
      echo "   $line" >&2
      awk -v h="$holders" -v l="$link" -v r="$round" '{
          for (i = 3; i <= NF; i++) v[$i] = $(i - 1)
          printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h, l, r, v["renewals/s"], v["p50-ms"], v["p99-ms"], v["requests/entry"], v["cpu-us/renewal"]
        }' <<<"$line" >>"$renew_tsv"
    done
  done
done

# 5. the doc ------------------------------------------------------------------
loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
elapsed=$(( $(date +%s) - script_start ))

# Rows of one call, in the order they ran.
agent_rows() {
  awk -F'\t' -v c="$1" -v what="$2" '$1 == c {
    printf "| %s | %s | %s | %d | %d | %.0f | %.0f | %s | %s | %s | %s | %s | %d |\n", what, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 + $14
  }' "$tsv"
}
# Each round's TLS row is compared with the plaintext row of the same round
# (minutes apart at most, so the machine's load weighs on both alike), and
# the per-round figures are summed up by their median and range: the load
# on this shared machine moves a row's absolute figures by tens of percent
# between rounds, much more than within one.
awk_stats='
  function sortn(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } }
  # med(v, n): the median of v[1..n] (sorted in place); lo and hi its range.
  function med(v, n) { sortn(v, n); lo = v[1]; hi = v[n]; return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
'
# Means over the rounds, and per-round differences to plaintext, per listener.
agent_ratios() {
  awk -F'\t' -v c="$1" -v what="$2" "$awk_stats"'
    $1 == c {
      k = $2; r = $3; rounds[r] = 1; n[k]++
      d[k, r] = $5; a[k, r] = $8; s[k, r] = $11; t[k, r] = $12
      sd[k] += $5; sa[k] += $8; p50[k] += $6; p99[k] += $7
    }
    END {
      split("plain tls mtls", order, " ")
      for (i = 1; i <= 3; i++) {
        k = order[i]; if (!n[k]) continue
        m = 0
        for (r in rounds) if ((k, r) in d && ("plain", r) in d) {
          m++; dr[m] = d[k, r] / d["plain", r]; ar[m] = a[k, r] / a["plain", r]
          ad[m] = a[k, r] - a["plain", r]; sdf[m] = s[k, r] - s["plain", r]; tdf[m] = t[k, r] - t["plain", r]
        }
        if (k == "plain") {
          printf "| %s | %s | %.0f | 1 | %.1f | 1 | | | | %.0f | %.0f |\n", what, k, sd[k] / n[k], sa[k] / n[k], p50[k] / n[k], p99[k] / n[k]
          continue
        }
        x = med(dr, m); xr = sprintf("%.2f (%.2f-%.2f)", x, lo, hi)
        y = med(ar, m); yr = sprintf("%.2f (%.2f-%.2f)", y, lo, hi)
        z = med(ad, m); zr = sprintf("%+.1f (%+.1f to %+.1f)", z, lo, hi)
        printf "| %s | %s | %.0f | %s | %.1f | %s | %s | %+.1f | %+.1f | %.0f | %.0f |\n", what, k,
          sd[k] / n[k], xr, sa[k] / n[k], yr, zr, med(sdf, m), med(tdf, m), p50[k] / n[k], p99[k] / n[k]
      }
    }' "$tsv"
}
# One row per call of BenchmarkListenerTLS: its metrics by unit.
listener_rows() {
  awk '/^BenchmarkListenerTLS\/call=/ {
      split($1, a, "[=-]"); call = a[2]
      for (i = 3; i <= NF; i++) v[$i] = $(i - 1)
      what = call == "empty" ? "empty unary" : call == "allow" ? "unary Allow (memory store)" : "HTTP /v1/check (memory store)"
      printf "| %s | %.0f | %.1f | %.1f | %+.1f | %.1f | %+.1f |\n", what, v["plain-calls/s"], v["plain-us/call"],
        v["tls-us/call"], v["tls-extra-us/call"], v["mtls-us/call"], v["mtls-extra-us/call"]
    }' "$work/results/listener.txt"
}
renew_rows() {
  awk -F'\t' '{ printf "| %s | %s | %s | %.0f | %.2f | %.2f | %.2f | %.0f |\n", $1, $2, $3, $4, $5, $6, $7, $8 }' "$renew_tsv"
}
renew_ratios() {
  awk -F'\t' "$awk_stats"'
    { k = $1 SUBSEP $2; n[k]++; rs[k] += $4; p50[k] += $5; p99[k] += $6; cs[k] += $8; h[$1] = 1; rounds[$3] = 1
      v[$1, $2, $3] = $4; c[$1, $2, $3] = $8 }
    END {
      for (x in h) hs[++nh] = x + 0
      sortn(hs, nh)
      for (i = 1; i <= nh; i++) {
        p = hs[i] SUBSEP "plaintext"; q = hs[i] SUBSEP "mtls"
        if (!n[p] || !n[q]) continue
        m = 0
        for (r in rounds) if ((hs[i], "plaintext", r) in v && (hs[i], "mtls", r) in v) {
          m++; rr[m] = v[hs[i], "mtls", r] / v[hs[i], "plaintext", r]; cr[m] = c[hs[i], "mtls", r] / c[hs[i], "plaintext", r]
        }
        x = med(rr, m); xr = sprintf("%.2f (%.2f-%.2f)", x, lo, hi)
        y = med(cr, m); yr = sprintf("%.2f (%.2f-%.2f)", y, lo, hi)
        printf "| %d | %.0f | %.0f | %s | %.2f / %.2f | %.2f / %.2f | %.0f | %.0f | %s |\n", hs[i],
          rs[p] / n[p], rs[q] / n[q], xr, p50[p] / n[p], p50[q] / n[q], p99[p] / n[p], p99[q] / n[q],
          cs[p] / n[p], cs[q] / n[q], yr
      }
    }' "$renew_tsv"
}

agent_head='| call | listener | round | decisions/s | decided/s | p50 µs | p99 µs | CPU µs/decision agent | redis | coordinator | servers | tool | errors + policy |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'
begin='<!-- bench-tls:begin: scripts/bench-tls.sh writes from here to the end marker -->'
end='<!-- bench-tls:end -->'
block="$work/block.md"
{
  echo "$begin"
  cat <<EOF

| | |
| --- | --- |
| date | $(date -u +'%Y-%m-%d %H:%M UTC') |
| code | $commit |
| machine | $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(uname -sr); nothing pinned to a CPU |
| Go | $("$GO" env GOVERSION) |
| Redis | redis-server $redis_version (\`--save '' --appendonly no\`), on loopback |
| TLS negotiated | gRPC: ${tls_neg:-n/a} (-listen-tls), ${mtls_neg:-n/a} (-listen-client-auth); HTTP: ${https_neg:-n/a}; ECDSA P-256 certificates (ration-certs) |
| load average at start, at end | $loadavg_start; $loadavg_end |
| script run time | ${elapsed}s |
${BENCH_NOTE:+
$BENCH_NOTE
}
Three gateway-agents run side by side, identical (same rules, same
redis-server, the same one-node coordinator, reached over mutual TLS by
all three) but for their listeners: \`plain\` (plaintext), \`tls\`
(\`-listen-tls\`: the gateway verifies the agent's certificate) and
\`mtls\` (\`-listen-tls -listen-client-auth\`: the agent also verifies the
gateway's). Each row: ration-bench, closed loop, $CONC callers over 4
connections (kept open: the handshakes are made before the measured
window, so these are the costs of encrypted traffic, not of handshakes),
$DURATION after a $WARMUP warmup; the three agents take turns for each
call, in the opposite order in every other round (rounds: $ROUNDS). CPU is
utime+stime from /proc over the measured window divided by the decisions:
"servers" is agent + redis + coordinator, "tool" is ration-bench itself
(which does the client side of the encryption). "errors + policy" counts
failed calls and decisions a failure policy answered (0 means every
decision was a bucket's).

Against plaintext: each TLS row is compared with the plaintext row of its
own round, and the table gives the median of the rounds' ratios and
differences (their range in brackets); decided/s, CPU and latency are the
means of the rounds. "µs over plaintext" is the CPU a decision costs more
with this listener: the agent's, the servers' (agent + redis +
coordinator) and ration-bench's (the client side of the encryption).

| call | listener | decided/s | ratio to plaintext | agent CPU µs/decision | ratio to plaintext | agent µs over plaintext | servers µs over plaintext | tool µs over plaintext | p50 µs | p99 µs |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
$(agent_ratios empty "empty unary")
$(agent_ratios allow "unary Allow (Redis)")
$(agent_ratios leased "unary Allow (leased)")
$(agent_ratios http "HTTP /v1/check (Redis)")

<details><summary>Every row, in the order they ran</summary>

$agent_head
$(agent_rows empty "empty unary")
$(agent_rows allow "unary Allow (Redis)")
$(agent_rows leased "unary Allow (leased)")
$(agent_rows http "HTTP /v1/check (Redis)")

</details>

The same three listeners finely interleaved: \`BenchmarkListenerTLS\`
(cmd/ration-bench), three agents in one process (memory store, the
\`-dev\` rules; the same listener code) and ration-bench's own callers
(64 per agent, over 4 gRPC connections or 64 HTTP/1.1 ones) take turns
in slices of 100ms, ${LISTENER_ROUNDS} rounds, in the opposite order in every
other round. CPU is the process's: both ends of every call, the agent's
server side and the gateway's client side. Medians over the rounds; "over
plaintext" is the median of each round's difference to its plaintext
slice. At 100ms apart the machine's load is nearly the same for the
three, which the rows above, seconds apart, cannot promise.

| call | calls/s plaintext | µs/call plaintext | -listen-tls | over plaintext | -listen-client-auth | over plaintext |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
$(listener_rows)
$(if [ "$listener_status" -ne 0 ]; then echo; echo "**BenchmarkListenerTLS failed (status $listener_status)**."; fi)

### Renewals over mutual TLS

\`BenchmarkLeasesOverTLS\` (internal/coordinator): three coordinator nodes
(Raft over loopback TCP, BoltDB with fsync on temporary dirs) and the
holders' clients (at most 8, shared round-robin) in one process on this
machine's $(nproc) CPUs; one op is one \`Renew\` of one lease, each holder
its own quota. \`mtls\` is mutual TLS on every link (the holders' gRPC
calls and the Raft transport; each client's certificate names its holders'
agent ids). CPU is the whole process's (3 nodes and clients) per renewal.
The links take turns per holder count, in the opposite order in every
other round (rounds: $RENEW_ROUNDS; \`-benchtime $RENEW_BENCHTIME\`).

Means of the rounds; the ratios are the median of each round's mTLS row
against its plaintext row (range in brackets):

| holders | renewals/s plaintext | renewals/s mTLS | ratio | p50 ms plaintext / mTLS | p99 ms plaintext / mTLS | CPU µs/renewal plaintext | mTLS | ratio |
| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |
$(renew_ratios)

| holders | links | round | renewals/s | p50 ms | p99 ms | requests/entry | CPU µs/renewal |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |
$(renew_rows)
$(if [ "$renew_status" -ne 0 ]; then echo; echo "**a renewal benchmark failed (status $renew_status)**: its row is missing; the others are shown."; fi)

Reproduce with \`make bench-tls\` (scripts/bench-tls.sh). It runs, with
\`\$CERTS\` its PKI (\`ration-certs -out \$CERTS -coordinators dev -agents
plain,tls,mtls -gateways bench -operators '' -hosts localhost,127.0.0.1\`), and
\`\$COORD\`, \`\$GRPC_<name>\`, \`\$HTTP_<name>\` and the pids read from the
logs:

\`\`\`sh
redis-server --port \$REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy noeviction
coordinator -dev -rules rules.yaml -raft 127.0.0.1:0 -grpc 127.0.0.1:0 -http 127.0.0.1:0 -tls-cert \$CERTS/coordinator-dev.crt -tls-key \$CERTS/coordinator-dev.key -tls-ca \$CERTS/ca.crt
EOF
  for row in "${configs[@]}"; do
    IFS='|' read -r name aflags _ <<<"$row"
    echo "gateway-agent -rules rules.yaml -redis 127.0.0.1:\$REDIS_PORT -coordinators \$COORD -grpc 127.0.0.1:0 -http 127.0.0.1:0 -id $name -decision-timeout $DECISION_TIMEOUT -tls-cert \$CERTS/agent-$name.crt -tls-key \$CERTS/agent-$name.key -tls-ca \$CERTS/ca.crt${aflags:+ $aflags}"
  done
  for call in "${calls[@]}"; do
    IFS='|' read -r _ _ flags <<<"$call"
    for name in "${names[@]}"; do
      f=${flags//\$GRPC/\$GRPC_$name}
      f=${f//\$HTTP/\$HTTP_$name}
      f=${f//\$PREFIX/l$name<round>-}
      bf=${bflags[$name]//$certs/\$CERTS}
      echo "ration-bench $common -pids \$AGENT_PID_$name,\$REDIS_PID,\$COORD_PID $f${bf:+ $bf}"
    done
  done
  echo "$listener_cmd"
  printf '%s\n' "${renew_cmds[@]}"
  echo '```'
  echo
  echo 'with this rules.yaml (given to the agents and to the coordinator):'
  echo
  echo '```yaml'
  cat "$work/rules.yaml"
  echo '```'
  echo
  echo "$end"
} >"$block"

if [ -f "$OUT" ] && grep -qxF "$end" "$OUT" && grep -q '^<!-- bench-tls:begin' "$OUT"; then
  awk -v blockfile="$block" -v endm="$end" '
    /^<!-- bench-tls:begin/ { while ((getline l < blockfile) > 0) print l; skip = 1; next }
    skip && $0 == endm { skip = 0; next }
    !skip { print }' "$OUT" >"$work/out.md"
  cat "$work/out.md" >"$OUT"
else
  { [ -f "$OUT" ] && echo; echo "## TLS"; echo; cat "$block"; } >>"$OUT"
fi
say "wrote the TLS block of $OUT (${elapsed}s)"
[ "$listener_status" -eq 0 ] || die "BenchmarkListenerTLS failed (status $listener_status); the rest of the run is in $OUT"
[ "$renew_status" -eq 0 ] || die "a renewal benchmark failed (status $renew_status); the rest of the run is in $OUT"
