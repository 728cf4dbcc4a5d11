#!/usr/bin/env bash
# Bucket store benchmarks, beside the ceiling they are measured against:
# what redis-server itself does with the same Lua script, from
# redis-benchmark, unpipelined and pipelined. Everything runs on loopback.
#
#   scripts/bench-redis.sh [go test -bench regexp]   (default: all of internal/bucket)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-deps.sh

bench=${1:-.}
dir=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# A free port: try a few random ones.
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 20000))
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir" --logfile "$dir/redis.log" --daemonize yes --pidfile "$dir/redis.pid"
  for _ in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  if [ -f "$dir/redis.pid" ] && redis-cli -p "$port" ping >/dev/null 2>&1; then
    pid=$(cat "$dir/redis.pid")
    break
  fi
done
[ -n "$pid" ] || { echo "could not start redis-server" >&2; cat "$dir/redis.log" >&2; exit 1; }

sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat internal/bucket/redis.lua)")
echo "== redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), $(nproc) cores; script $sha"
for p in 1 16; do
  printf 'redis-benchmark EVALSHA take, 64 clients, pipeline %-2s: ' "$p"
  redis-benchmark -p "$port" -q -n 300000 -c 64 -P "$p" -r 10000 \
    EVALSHA "$sha" 1 'ration:{bench|__rand_int__}' take 1e+09 1e+06 1 2002000 |
    tr '\r' '\n' | grep 'requests per second' | sed 's/.*: //'
done
redis-cli -p "$port" INFO commandstats | grep '^cmdstat_evalsha' |
  sed 's/.*usec_per_call=\([^,]*\).*/server time per script call: \1 µs/'
kill "$pid"; pid=

echo "== go test -run '^\$' -bench '$bench' -benchmem ./internal/bucket/"
go test -run '^$' -bench "$bench" -benchmem ./internal/bucket/
