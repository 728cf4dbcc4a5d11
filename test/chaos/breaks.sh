#!/usr/bin/env bash
# make chaos-breaks: every scenario run with its protection removed
# (RATION_CHAOS_BREAK, documented on each test and in
# docs/reliability.md) must fail, and fail by a judge: the run must exit
# non-zero AND print a FAIL row for the scenario. Exits non-zero if any
# break passes (or fails some other way, e.g. in its setup). The breaks of
# S9, S9f, S19, S20 and S21 are edits of the code (codeBreaks in
# test/chaos/codebreaks_test.go), built into that run's binaries with
# go build -overlay; the tree is not touched.
#
#   test/chaos/breaks.sh            # all of them
#   test/chaos/breaks.sh S3 S10     # some
set -u
cd "$(dirname "$0")"
declare -A tests=(
  [S0]=TestS0NoFault [S0e]=TestS0Embedded [S3e]=TestS3Embedded [S1]=TestS1LeaderKilled [S1pause]=TestS1LeaderPaused
  [S2]=TestS2DeposedLeader [S3]=TestS3AgentCutOff [S4]=TestS4LeaseRepliesDropped
  [S5]=TestS5NoQuorum [S6]=TestS6AgentPaused [S8]=TestS8RedisFailover [S9]=TestS9ClusterMasterDown [S9f]=TestS9ClusterFailover
  [S10]=TestS10RedisBlackholed [S11]=TestS11LostReplies [S13]=TestS13RestartFromDisk
  [S14]=TestS14EnvoyLeaderKilled [S15]=TestS15LeasedRequestIDs [S16]=TestS16SameAgentID
  [S17]=TestS17DefaultShareLeaderKilled [S18]=TestS18AutoFlipsHotAndCold
  [S19]=TestS19DefaultShareSlowLinkArrival [S20]=TestS20AutoFailoverLosesMark
  [S21]=TestS21RLQSThroughFaults [soak]=TestSoak
)
order=(S0 S0e S1 S1pause S2 S3 S3e S4 S5 S6 S8 S9 S9f S10 S11 S13 S14 S15 S16 S17 S18 S19 S20 S21 soak)
[ $# -gt 0 ] && order=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/chaos.test" . || exit 2
bad=0
for s in "${order[@]}"; do
  t=${tests[$s]:-}
  if [ -z "$t" ]; then echo "chaos-breaks: no scenario $s"; bad=1; continue; fi
  start=$SECONDS
  # The soak runs when RATION_SOAK names a duration: 2m, time for one
  # fault and its judging (it reports its own table, not rows).
  RATION_SOAK=2m RATION_CHAOS_BREAK=$s "$tmp/chaos.test" -test.count=1 -test.run "^$t\$" -test.v >"$tmp/$s.log" 2>&1
  rc=$?
  rows=$(grep -E '^\| S[0-9]' "$tmp/$s.log" | grep -F '| FAIL |' | cut -d'|' -f2 | tr -s ' ' | paste -sd, -)
  if [ "$s" = soak ]; then
    rows=$(grep -E '^\s*\| [a-z-]+( eu| us)? \|.*\| FAIL \|$' "$tmp/$s.log" | cut -d'|' -f2 | tr -s ' ' | paste -sd, -)
  fi
  if [ $rc -ne 0 ] && [ -n "$rows" ]; then
    echo "chaos-breaks: $s failed as it must ($((SECONDS - start))s): FAIL rows:$rows"
    grep -E '^\s+(\S+_test|judges)\.go:[0-9]+: ' "$tmp/$s.log" | grep -v 'chaos: \|soak +' | head -4 | cut -c1-300 | sed 's/^/    /'
  else
    echo "chaos-breaks: $s did NOT fail by a judge (exit $rc, FAIL rows: '${rows}'); output in the log below"
    tail -40 "$tmp/$s.log"
    bad=1
  fi
done
exit $bad
