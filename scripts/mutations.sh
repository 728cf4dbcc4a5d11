#!/usr/bin/env bash
# make mutations (and make test): every patch in test/mutations removes or
# breaks one protection of Ration on purpose, and the test its header names
# must then fail. A protection that no test misses when it is removed is
# either not needed or not tested. Each patch's header says what it
# breaks ("breaks: ...") and which test must catch it ("test: <package>
# <go test -run pattern>"). Nothing here is changed: a patch is applied to
# copies of the files it touches, which `go test -overlay` builds in their
# place, so every patch shares one build cache with the others and with
# the tree (a package no patch touches is compiled once). MUTATION_WORKERS
# (default 3) patches run side by side.
#
#   scripts/mutations.sh                      # all of them
#   scripts/mutations.sh reserved-subject     # test/mutations/reserved-subject.patch
#   scripts/mutations.sh test/bound/testdata/bound-lease-term.patch
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
patches=()
if [ $# -gt 0 ]; then
  for n in "$@"; do
    case $n in
      *.patch) patches+=("$n") ;; # a patch kept elsewhere, e.g. test/bound/testdata
      *) patches+=("test/mutations/$n.patch") ;;
    esac
  done
else
  patches=(test/mutations/*.patch)
fi

# shellcheck source=lib/overlay.sh
. scripts/lib/overlay.sh

# Compile once what every patch shares (the packages the test binaries
# import, as the tree has them), so the workers do not each compile it at
# the start. The package under test is compiled without optimisations
# (-N -l applies to the packages named on the command line only; their
# imports come from the build cache as built here): about a third less
# CPU a patch, and what a patch breaks is behaviour, not speed.
gcflags="-N -l"
pkgs=$(sed -n 's/^test: \([^ ]*\) .*/\1/p' "${patches[@]}" | sort -u)
# shellcheck disable=SC2086 # one word per package
go build $(go list -deps -test $pkgs | grep -v -e ' \[' -e '\.test$') >"$tmp/warm.txt" 2>&1 || { cat "$tmp/warm.txt"; exit 1; }

# The catching test's binary leaves out the package's test files that the
# test does not reach (test/mutations/testprune): in internal/agent they
# outweigh the code, and each patch compiles them again.
go build -o "$tmp/testprune" ./test/mutations/testprune
# prune OVERLAY PKG PATTERN adds the test files PATTERN's tests do not
# need to OVERLAY as deleted ("").
prune() {
  local json=$1 pkg=$2 pattern=${3%%/*} f extra=''
  local tests
  tests=$(tr -d '^$()' <<<"$pattern" | tr '|' ' ')
  # shellcheck disable=SC2086 # one word per test
  for f in $("$tmp/testprune" "$pkg" $tests 2>/dev/null); do
    grep -qF "\"$f\"" "$json" || extra+=",\"$f\":\"\""
  done
  [ -z "$extra" ] || sed -i "s|}}\$|${extra}}}|" "$json"
}

# A failing test mostly waits (for a deadline, a timeout), so three patches
# at a time share two cores well.
workers=${MUTATION_WORKERS:-3}
run_worker() {
  local w=$1 i=0 bad=0
  for p in "${patches[@]}"; do
    i=$((i + 1))
    [ $(((i - 1) % workers)) -eq "$w" ] || continue
    name=$(basename "$p" .patch)
    res="$tmp/$(printf '%03d' "$i")-$name.res"
    read -r pkg pattern <<<"$(sed -n 's/^test: //p' "$p")"
    # args: extra go test flags, e.g. a property test's fixed seed and
    # enough checks that it finds the bug on every run.
    read -r -a args <<<"$(sed -n 's/^args: //p' "$p")"
    if [ -z "${pkg:-}" ] || [ -z "${pattern:-}" ]; then
      echo "mutations: $name: no 'test: <package> <pattern>' line" >"$res"
      bad=1
      continue
    fi
    dir="$tmp/$name"
    if ! overlay "$p" "$dir" 2>"$dir.apply"; then
      { echo "mutations: $name: the patch no longer applies; refresh it:"; cat "$dir.apply"; } >"$res"
      bad=1
      continue
    fi
    prune "$dir/overlay.json" "$pkg" "$pattern"
    out="$tmp/$name.txt"
    start=$SECONDS
    # -vet=off: make test vets the tree once (go vet ./...), and a patch's
    # vet run cost about 6s of CPU each, a third of the whole step.
    # RATION_MUTATION_OVERLAY: what a test builds besides its own binary
    # (the chaos scenarios' agents and coordinators) is built with the
    # patch too.
    if RATION_MUTATION_OVERLAY="$dir/overlay.json" go test -vet=off -gcflags="$gcflags" -overlay "$dir/overlay.json" -count=1 -timeout 5m -run "$pattern" "$pkg" "${args[@]}" >"$out" 2>&1; then
      { echo "mutations: $name NOT caught by $pkg $pattern:"; sed -n 's/^breaks: /  breaks: /p' "$p"; } >"$res"
      bad=1
    elif grep -q -e '^--- FAIL' -e '^panic: ' "$out"; then
      echo "mutations: $name caught by $(grep -m1 '^--- FAIL' "$out" | sed 's/^--- FAIL: //; s/ (.*//') ($pkg, $((SECONDS - start))s)" >"$res"
    else
      { echo "mutations: $name failed without a failing test (a build error?):"; tail -20 "$out"; } >"$res"
      bad=1
    fi
  done
  return $bad
}
pids=()
for ((w = 0; w < workers; w++)); do
  run_worker "$w" &
  pids+=($!)
done
bad=0
for pid in "${pids[@]}"; do
  wait "$pid" || bad=1
done
cat "$tmp"/*.res
exit $bad
