#!/usr/bin/env bash
# make sim-mutations: every patch in internal/sim/testdata/mutations breaks
# internal/lease or internal/holder on purpose; the simulator must catch
# each one (ration-sim exits 1 with "verdict: FAIL") at every seed its
# header names ("seeds: 1 2 3"), with the ration-sim flags its header
# gives ("flags: -nudges", optional). Nothing here is changed (see
# scripts/lib/overlay.sh). A report that passes is printed in full.
#
#   scripts/sim-mutations.sh                  # all of them
#   SIM_MUTATION_SEEDS=first scripts/sim-mutations.sh  # each at its first seed
#   scripts/sim-mutations.sh 03-holder-double-validity
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
patches=()
if [ $# -gt 0 ]; then
  for n in "$@"; do patches+=("internal/sim/testdata/mutations/$n.patch"); done
else
  patches=(internal/sim/testdata/mutations/*.patch)
fi
# shellcheck source=lib/overlay.sh
. scripts/lib/overlay.sh
bad=0
for p in "${patches[@]}"; do
  name=$(basename "$p" .patch)
  src="$tmp/$name"
  if ! overlay "$p" "$src"; then
    echo "sim-mutations: $name: the patch no longer applies; refresh it"
    bad=1
    continue
  fi
  go build -overlay "$src/overlay.json" -o "$tmp/$name.bin" ./cmd/ration-sim
  read -r -a flags <<<"$(sed -n 's/^flags: //p' "$p")"
  seeds=$(sed -n 's/^seeds: //p' "$p")
  # SIM_MUTATION_SEEDS=first (make test): each patch at the first seed
  # its header names; every seed is deterministic, and make sim-mutations
  # runs them all.
  [ "${SIM_MUTATION_SEEDS:-}" != first ] || seeds=${seeds%% *}
  for seed in $seeds; do
    out="$tmp/$name-$seed.txt"
    if "$tmp/$name.bin" -config small -seed "$seed" "${flags[@]}" >"$out" 2>&1; then
      echo "sim-mutations: $name seed $seed NOT caught:"
      cat "$out"
      bad=1
    elif grep -q '^verdict: FAIL' "$out"; then
      echo "sim-mutations: $name seed $seed${flags[*]:+ ${flags[*]}} caught: $(grep '^verdict' "$out")"
    else
      echo "sim-mutations: $name seed $seed failed without a verdict:"
      cat "$out"
      bad=1
    fi
  done
done
exit $bad
