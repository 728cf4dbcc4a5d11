#!/usr/bin/env bash
# tier.sh NAME COMMAND...: runs COMMAND and, when TEST_STATUS names a file,
# appends one line to it: NAME, ok or FAILED, and how long it took. make
# test prints that file at its end, so its last lines say what ran and
# what failed, whichever part failed first.
name=$1
shift
start=$SECONDS
"$@"
rc=$?
if [ -n "${TEST_STATUS:-}" ]; then
  if [ $rc -eq 0 ]; then verdict=ok; else verdict="FAILED (exit $rc)"; fi
  printf '  %-58s %s, %ds\n' "$name" "$verdict" $((SECONDS - start)) >>"$TEST_STATUS"
fi
exit $rc
