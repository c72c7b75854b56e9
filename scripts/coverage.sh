#!/usr/bin/env bash
# coverage.sh BUILD JOBS: the part of `make coverage` after the build. Runs the whole ctest
# suite in BUILD (configured with -DKVS_COVERAGE=ON), captures the gcov counters with lcov,
# keeps src/ and include/, prints lcov's summary and a per-directory table
# (scripts/coverage_report.py), lists the kvs_fail( call sites never executed
# (BUILD/kvs_fail_unhit.txt), writes the HTML report to BUILD/coverage-html/, and ends with
# lcov's summary lines.
set -euo pipefail
build=$1 jobs=${2:-2}
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)
rc=(--rc lcov_branch_coverage=1)
info=$build/coverage.info

# Counters of an earlier run would add up with this one's.
lcov --quiet --zerocounters --directory "$build"
status=0
(cd "$build" && ctest --output-on-failure -j "$jobs") || status=$?

# Debian's lcov 1.16 warns of its own Perl subroutines being redefined: not ours to see.
lcov --quiet "${rc[@]}" --capture --directory "$build" --output-file "$build/coverage.raw.info" \
  2> >(grep -v '^Subroutine .* redefined at' >&2)
lcov --quiet "${rc[@]}" --extract "$build/coverage.raw.info" "$src/src/*" "$src/include/*" \
  --output-file "$info.tmp"
lcov --quiet "${rc[@]}" --remove "$info.tmp" "$src/tests/*" "$src/tools/*" "/usr/*" \
  --output-file "$info"
rm -f "$info.tmp"
genhtml --quiet "${rc[@]}" --branch-coverage --prefix "$src" --output-directory \
  "$build/coverage-html" "$info" >/dev/null

echo
echo "Coverage of src/ by the test suite ($info; HTML: $build/coverage-html/index.html):"
lcov "${rc[@]}" --summary "$info" 2>&1 | grep -E '^ *(lines|functions|branches)'
echo
python3 "$src/scripts/coverage_report.py" "$info" "$src" "$build/kvs_fail_unhit.txt"
# lcov's summary lines again, last, so the run ends with them.
echo
lcov "${rc[@]}" --summary "$info" 2>&1 | grep -E '^ *(lines|functions|branches)'
if [ "$status" -ne 0 ]; then
  echo "coverage: some tests failed (ctest exit $status): the numbers above miss what they skipped" >&2
  exit "$status"
fi
