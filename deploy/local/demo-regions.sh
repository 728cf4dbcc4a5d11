#!/usr/bin/env bash
# A local multi-region Ration on loopback, in one command:
#
#   global coordinator group (3 nodes)
#        |  leases region slices of scope: global, mode: leased rules
#   +----+--------------------+
#   eu: redis, coordinator,    us: redis, coordinator,
#       agents eu-a1, eu-a2        agents us-a1, us-a2
#
# Usage:
#   deploy/local/demo-regions.sh            start, print a guide, run until Ctrl-C
#   deploy/local/demo-regions.sh --check [S] start, drive global-api from all
#                                            four agents for S seconds (default
#                                            20), then check every admission
#                                            against B + r*T (ration-check) and
#                                            the utilisation; exit 1 if not met
#
# Environment: BASE_PORT (default 17000; ports BASE_PORT..BASE_PORT+60),
# DEMO_DIR (default a new temporary directory: binaries, data, logs).
set -euo pipefail

mode=run
secs=20
if [[ "${1:-}" == "--check" ]]; then
  mode=check
  secs="${2:-20}"
elif [[ -n "${1:-}" ]]; then
  sed -n '2,18p' "$0"
  exit 2
fi

root="$(cd "$(dirname "$0")/../.." && pwd)"
base="${BASE_PORT:-17000}"
dir="${DEMO_DIR:-$(mktemp -d -t ration-regions.XXXXXX)}"
bin="$dir/bin"
rules="$root/deploy/local/regions.yaml"
mkdir -p "$bin" "$dir/logs"
# Mutual TLS on every coordinator link, as in production: a development
# CA made here (ration-certs, Go's crypto, no network) gives each process
# a certificate naming what it acts as (docs/security.md): the global
# nodes, each regional node (and its region), each agent (its -id), and an
# operator for the coordinator CLI, which reads the RATION_TLS_* variables.
certs="$dir/certs"

command -v redis-server >/dev/null || { echo "redis-server missing: make deps" >&2; exit 2; }

echo "building into $bin ..."
(cd "$root" && go build -o "$bin/" ./cmd/coordinator ./cmd/gateway-agent ./cmd/ration-bench ./cmd/ration-check ./internal/certgen/ration-certs)
"$bin/ration-certs" -out "$certs" -coordinators global0,global1,global2,eu-0@eu,us-0@us \
  -agents eu-a1,eu-a2,us-a1,us-a2 -operators demo >/dev/null
tls() { # certificate name: the -tls-* flags of that process
  echo -tls-cert "$certs/$1.crt" -tls-key "$certs/$1.key" -tls-ca "$certs/ca.crt"
}
export RATION_TLS_CERT="$certs/operator-demo.crt" RATION_TLS_KEY="$certs/operator-demo.key" RATION_TLS_CA="$certs/ca.crt"

pids=()
cleanup() {
  local code=$?
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[$i]}" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  exit "$code"
}
trap cleanup EXIT INT TERM

start() { # name, command...
  local name="$1"
  shift
  "$@" >"$dir/logs/$name.log" 2>&1 &
  pids+=("$!")
}

wait_leader() { # admin address
  for _ in $(seq 1 150); do
    if "$bin/coordinator" status -addr "$1" -timeout 1s 2>/dev/null | grep -q '^node.*Leader'; then
      return 0
    fi
    sleep 0.1
  done
  echo "no leader at $1; see $dir/logs" >&2
  return 1
}

wait_ready() { # http address
  for _ in $(seq 1 150); do
    if curl -fs "http://$1/readyz" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  echo "agent at $1 not ready; see $dir/logs" >&2
  return 1
}

# Redis, one per region.
declare -A redis=([eu]=$((base + 0)) [us]=$((base + 1)))
for r in eu us; do
  start "redis-$r" redis-server --port "${redis[$r]}" --bind 127.0.0.1 --save "" --appendonly no \
    --maxmemory-policy noeviction --dir "$dir"
done

# The global group: three nodes, node 0 bootstraps (registering the
# others, which may then join with their own certificates), the others join
# through its admin listener (each node's admin port is its own).
global_grpc=()
global_admin=()
for i in 0 1 2; do
  p=$((base + 10 + 3 * i))
  global_grpc+=("127.0.0.1:$((p + 1))")
  global_admin+=("127.0.0.1:$((base + 20 + i))")
  args=(-id "global$i" -raft "127.0.0.1:$p" -grpc "127.0.0.1:$((p + 1))" -http "127.0.0.1:$((p + 2))"
    -admin "${global_admin[$i]}" -data-dir "$dir/global$i" -rules "$rules" -log-level warn $(tls "coordinator-global$i"))
  if [[ $i == 0 ]]; then
    start "global$i" "$bin/coordinator" "${args[@]}" -bootstrap -initial-members global1,global2
    wait_leader "${global_admin[0]}"
  else
    start "global$i" "$bin/coordinator" "${args[@]}" -join "${global_admin[0]}"
  fi
done
upstream="$(IFS=,; echo "${global_grpc[*]}")"

# One regional coordinator per region, a holder upstream of the global group.
declare -A region_grpc=([eu]="127.0.0.1:$((base + 31))" [us]="127.0.0.1:$((base + 41))")
declare -A region_admin=([eu]="127.0.0.1:$((base + 33))" [us]="127.0.0.1:$((base + 43))")
declare -A region_port=([eu]=$((base + 30)) [us]=$((base + 40)))
for r in eu us; do
  p=${region_port[$r]}
  start "coordinator-$r" "$bin/coordinator" -id "$r-0" -raft "127.0.0.1:$p" -grpc "127.0.0.1:$((p + 1))" \
    -http "127.0.0.1:$((p + 2))" -admin "${region_admin[$r]}" -data-dir "$dir/$r-0" -rules "$rules" -bootstrap \
    -region "$r" -upstream "$upstream" -upstream-renew-at 0.25 -log-level warn $(tls "coordinator-$r-0")
done
for r in eu us; do wait_leader "${region_admin[$r]}"; done

# Two agents per region, each recording every decision for ration-check.
declare -A agent_http agent_grpc
n=0
for r in eu us; do
  for a in a1 a2; do
    id="$r-$a"
    agent_http[$id]="127.0.0.1:$((base + 50 + 2 * n))"
    agent_grpc[$id]="127.0.0.1:$((base + 51 + 2 * n))"
    start "$id" "$bin/gateway-agent" -id "$id" -region "$r" -rules "$rules" -redis "127.0.0.1:${redis[$r]}" \
      -coordinators "${region_grpc[$r]}" -http "${agent_http[$id]}" -grpc "${agent_grpc[$id]}" \
      -record "$dir/logs/$id.admissions" -log-level warn $(tls "agent-$id")
    n=$((n + 1))
  done
done
for id in "${!agent_http[@]}"; do wait_ready "${agent_http[$id]}"; done

if [[ $mode == check ]]; then
  # Every agent offers 30/s of global-api (120/s against r = 50/s).
  echo "driving global-api from all four agents for ${secs}s ..."
  bench=()
  for id in eu-a1 eu-a2 us-a1 us-a2; do
    "$bin/ration-bench" -target "${agent_grpc[$id]}" -rule global-api -keys 1 -key-prefix x -rate 30 \
      -warmup 0s -duration "${secs}s" -json >"$dir/logs/bench-$id.json" 2>"$dir/logs/bench-$id.err" &
    bench+=("$!")
  done
  for p in "${bench[@]}"; do wait "$p"; done
  sleep 0.5 # the agents write their admission logs in batches
  echo "checking every admission against B + r*T ..."
  "$bin/ration-check" "$dir"/logs/*.admissions | tee "$dir/logs/check.txt"
  echo "logs, admission records and data: $dir"
  exit 0
fi

# The guide's commands run as written in a test (cmd/coordinator,
# TestDemoRegionsGuide): a command line is an indented line whose first
# word is one of the tools it knows; keep new ones that way.
cat <<GUIDE

Ration, two regions on loopback, mutual TLS on every coordinator link
(logs, data and the development CA's certificates in $dir):

  global group     ${global_grpc[*]}   (admin ${global_admin[*]})
  eu coordinator   ${region_grpc[eu]}   (admin ${region_admin[eu]})   redis 127.0.0.1:${redis[eu]}
  us coordinator   ${region_grpc[us]}   (admin ${region_admin[us]})   redis 127.0.0.1:${redis[us]}
  agents (HTTP)    eu-a1 ${agent_http[eu-a1]}  eu-a2 ${agent_http[eu-a2]}
                   us-a1 ${agent_http[us-a1]}  us-a2 ${agent_http[us-a2]}
  rules            $rules

Drive traffic: all three commands below ask for the same quota, subject
api=x0 of global-api (the descriptor api=x0), one budget of 50/s across
both regions (a subject named another way, such as -rule global-api with
subject x0, is a quota of its own, with its own 50/s):

  $bin/ration-bench -target ${agent_grpc[eu-a1]},${agent_grpc[eu-a2]} -descriptor-key api -keys 1 -key-prefix x -rate 60 -duration 60s &
  $bin/ration-bench -target ${agent_grpc[us-a1]},${agent_grpc[us-a2]} -descriptor-key api -keys 1 -key-prefix x -rate 10 -duration 60s &
  curl -s "http://${agent_http[eu-a1]}/v1/check?api=x0" -o /dev/null -w '%{http_code}\n'

The coordinator CLI below presents the operator certificate; in another
shell, set it first:

  export RATION_TLS_CERT=$certs/operator-demo.crt RATION_TLS_KEY=$certs/operator-demo.key RATION_TLS_CA=$certs/ca.crt

Watch the shares move (the global group's leases to region/eu and region/us,
then a region's subleases to its agents):

  watch -n1 $bin/coordinator leases -addr ${global_admin[0]}
  watch -n1 $bin/coordinator leases -addr ${region_admin[eu]}
  $bin/coordinator quotas -addr ${region_admin[eu]}      # BURST/RATE = safe share + upstream lease

Tune at run time (replicated, kept across restarts; docs/operations.md):

  $bin/coordinator tune -addr ${global_admin[0]} -rule global-api -region eu -weight 3
  $bin/coordinator tune -addr ${global_admin[0]} -rule global-api -region us -max-slice 5
  $bin/coordinator tunings -addr ${global_admin[0]}

Cut the regions off from the global group (they spend their slices, then
their safe shares of 10/s each):

  kill -STOP <pids of global0..2>   # kill -CONT to heal; pids: ps -ef | grep global

Check every admission so far against B + r*T:

  $bin/ration-check $dir/logs/*.admissions

Ctrl-C stops everything.
GUIDE
wait
