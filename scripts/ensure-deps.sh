#!/usr/bin/env bash
# Installs what Ration's tests need on a fresh machine: redis-server (with
# redis-sentinel and redis-benchmark), jq (scripts/bench.sh), nginx (the
# auth_request end-to-end test), caddy (the forward_auth one), chromium
# (the coordinator status page, rendered in headless Chromium) and a C
# compiler (internal/harness builds a shim that steps a redis-server's
# clock). Tests
# start their own servers on free loopback ports with their own files; a
# redis on 6379 or an nginx or caddy on 80 is neither used nor touched.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd) # deploy/ verifies the systemd units
command -v jq >/dev/null 2>&1 || need+=(jq) # scripts/bench.sh reads ration-bench JSON
# nginx is often in /usr/sbin, which is not on every user's PATH.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v caddy >/dev/null 2>&1 || need+=(caddy)
# Debian installs the browser as /usr/bin/chromium (the status page test runs it headless).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# harness.WithClock compiles an LD_PRELOAD shim; libc6-dev is only
# recommended by gcc, and its headers are needed.
{ command -v cc && echo '#include <sys/time.h>' | cc -E -x c -; } >/dev/null 2>&1 || need+=(gcc libc6-dev)

if [ ${#need[@]} -eq 0 ]; then exit 0; fi

if [ "$(id -u)" -ne 0 ]; then
  echo "missing: ${need[*]}; install them (Debian: sudo apt-get install -y ${need[*]}) and run make test again" >&2
  exit 1
fi
echo "installing ${need[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
# Package scripts must not start services (nginx on 80, redis on 6379): on a
# machine or container where those ports are taken, or with no init system,
# a failed start would fail the install. policy-rc.d is Debian's switch for
# that; ours is removed again afterwards.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
fi
trap '[ "$own_policy" = 1 ] && rm -f "$policy"' EXIT
# Wait for another apt-get or dpkg (an unattended upgrade, a second make)
# rather than fail on its lock.
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's packages may start services (redis on 6379, nginx on 80); the
# tests do not use them.
