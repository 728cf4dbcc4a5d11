#!/usr/bin/env bash
# Installs what Ration's tests need on a fresh machine: redis-server (with
# redis-sentinel and redis-benchmark). Tests start their own servers on free
# loopback ports; a redis already running on 6379 is neither used nor touched.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v jq >/dev/null 2>&1 || need+=(jq) # scripts/bench.sh reads ration-bench JSON

if [ ${#need[@]} -eq 0 ]; then exit 0; fi

if [ "$(id -u)" -ne 0 ]; then
  echo "missing: ${need[*]}; install them (Debian: sudo apt-get install -y redis-server redis-sentinel redis-tools) and run make test again" >&2
  exit 1
fi
echo "installing ${need[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's package starts a service on 6379; the tests do not use it.
