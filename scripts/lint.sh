#!/usr/bin/env bash
# make lint: cppcheck over src/, tools/ and include/ (warnings, portability, performance), in the
# configuration the build compiles: -D_GNU_SOURCE -DNDEBUG (Release) and, of the compiler's
# predefined macros that the sources test (OS, CPU, the SIMD extensions of -march=native), those
# this compiler defines. Any finding fails (exit 1). Suppressions: inline ones
# (/* cppcheck-suppress ID */ beside the code, with the reason in a comment) and
# scripts/cppcheck-suppressions.txt (one reason per entry).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
CC=${CC:-cc}
macros=(__GNUC__ __linux__ __x86_64__ __i386__ __aarch64__ __AVX2__ __FMA__ __F16C__
  __AVX512F__ __AVX512BW__ __AVX512VL__ __AVX512VNNI__ __AVX512VPOPCNTDQ__ __AES__ __VAES__)
predefined=$("$CC" -march=native -dM -E -x c /dev/null 2>/dev/null || "$CC" -dM -E -x c /dev/null)
defines=(-D_GNU_SOURCE -DNDEBUG)
for m in "${macros[@]}"; do
  grep -q "^#define $m " <<<"$predefined" && defines+=("-D$m")
done
echo "lint: cppcheck $(cppcheck --version | awk '{print $2}') ${defines[*]}" >&2
# -D limits the check to that one configuration (not every #ifdef combination); system headers
# are not parsed (missingIncludeSystem), the project's are (-I include -I src).
exec cppcheck -q -j "$JOBS" --std=c11 --language=c --enable=warning,portability,performance \
  --error-exitcode=1 --inline-suppr --suppressions-list=scripts/cppcheck-suppressions.txt \
  --suppress=missingIncludeSystem "${defines[@]}" -I include -I src src tools include
