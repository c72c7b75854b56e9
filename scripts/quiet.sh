#!/usr/bin/env bash
# quiet.sh LABEL LOG CMD...: runs CMD with its output appended to LOG; prints nothing on
# success, and the log's last 60 lines (with the failing step's label) on failure.
set -uo pipefail
label=$1 log=$2
shift 2
mkdir -p "$(dirname "$log")"
[ "$label" = configure ] && : >"$log"
status=0
"$@" >>"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  echo "make: $label failed (exit $status); last lines of $log:" >&2
  tail -n 60 "$log" >&2
  exit "$status"
fi
