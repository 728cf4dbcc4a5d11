# Sourced by scripts/bench.sh and scripts/bench-tls.sh: a redis-server of
# their own on a free loopback port (never the machine's 6379), with no
# persistence. The caller defines die, say, work and the procs array.

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_redis: sets redis_port, rpid and redis_version, and adds the
# server to procs; up to 20 random ports are tried.
start_redis() {
  local p
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
}
