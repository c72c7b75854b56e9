#!/usr/bin/env bash
# The installed package: `cmake --install` into a temporary prefix, then examples/generate.c
# built against it with pkg-config (shared library) and with find_package(kvslim) (shared and
# static), run on stories260K: the greedy text equals `kvslim run --temp 0`, the shared builds
# load libkvslim.so from the prefix, the .so exports the functions of kvslim.h and nothing else,
# and no internal header is installed.
source "$(dirname "$0")/lib.bash"
: "${KVS_BUILD_DIR:?run through ctest}" "${KVS_SOURCE_DIR:?}"
PREFIX=$TMP/prefix
MODEL=$MODELS/gguf/stories260K-f32.gguf
PROMPT="Once upon a time"
SPEC=streaming:slots=24
# A sanitized library needs the sanitizer runtime in its programs: kvslim.pc and the CMake
# targets carry -fsanitize=address,undefined in that build (see CMakeLists.txt); likewise
# --coverage in the gcov build (make coverage).

if cmake --install "$KVS_BUILD_DIR" --prefix "$PREFIX" >"$TMP/install.log" 2>&1; then
  pass "cmake --install into $PREFIX"
else
  fail "cmake --install: $(tail -n 5 "$TMP/install.log")"
  finish
  exit 1
fi
pc=$(find "$PREFIX" -name kvslim.pc 2>/dev/null | head -n 1)
if [ -z "$pc" ]; then
  fail "no kvslim.pc installed under $PREFIX: $(find "$PREFIX" -type f 2>/dev/null | head -n 5 | tr '\n' ' ')"
  finish
  exit 1
fi
PCDIR=$(dirname "$pc")
LIBDIR=$(dirname "$PCDIR")
[ -f "$LIBDIR/libkvslim.a" ] && [ -f "$LIBDIR/libkvslim.so" ] && [ -f "$PREFIX/include/kvslim.h" ] &&
  pass "installed: lib/libkvslim.a, lib/libkvslim.so, include/kvslim.h" ||
  fail "installed files: $(cd "$PREFIX" && find . -type f | sort | tr '\n' ' ')"
headers=$(cd "$PREFIX" && find . -name '*.h' | sort | tr '\n' ' ')
[ "$headers" = "./include/kvslim.h " ] && pass "the only installed header is kvslim.h" ||
  fail "installed headers: $headers"

# Exported symbols = the functions declared in kvslim.h.
grep -oE '\bkvs_[a-z0-9_]+\(' "$KVS_SOURCE_DIR/include/kvslim.h" | tr -d '(' | sort -u >"$TMP/api"
nm -D --defined-only "$LIBDIR/libkvslim.so" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' |
  sort -u >"$TMP/exported"
if cmp -s "$TMP/api" "$TMP/exported"; then
  pass "libkvslim.so exports the $(wc -l <"$TMP/api") functions of kvslim.h and nothing else"
else
  fail "exports differ from kvslim.h: $(diff "$TMP/api" "$TMP/exported" | grep '^[<>]' | head -5 | tr '\n' ' ')"
fi

# The reference: the CLI on the same model, prompt, policy and KV type.
"$KVS_BIN" run -m "$MODEL" -p "$PROMPT" -n 64 --temp 0 -t 2 --kv "$SPEC" --kv-type f16 \
  >"$TMP/want" 2>"$TMP/want.err" || fail "kvslim run: $(cat "$TMP/want.err")"

# check_run NAME BINARY: runs it, compares its text with the CLI's, checks its KV line.
check_run() {
  local name=$1 bin=$2
  local status=0
  "$bin" "$MODEL" "$PROMPT" "$SPEC" >"$TMP/$name.out" 2>"$TMP/$name.err" || status=$?
  if [ "$status" -ne 0 ]; then
    fail "$name: exit status $status: $(head -c 400 "$TMP/$name.err")"
    return
  fi
  cmp -s "$TMP/$name.out" "$TMP/want" &&
    pass "$name: greedy text equals kvslim run --temp 0 ($(wc -c <"$TMP/want") bytes)" ||
    fail "$name: text differs from kvslim run: $(head -c 200 "$TMP/$name.out")"
  # streaming:slots=24 holds 24 slots per layer and KV head, fewer than the prompt and 64
  # generated tokens a full cache would hold.
  local held full
  read -r held full < <(sed -nE 's/.*KV ([0-9]+) bytes held \(full F16 cache: ([0-9]+) bytes\).*/\1 \2/p' "$TMP/$name.err")
  [ -n "${held:-}" ] && [ "$held" -gt 0 ] && [ "$held" -lt "$full" ] &&
    pass "$name: $(cat "$TMP/$name.err")" || fail "$name: KV line: $(cat "$TMP/$name.err")"
}

# 1. pkg-config, shared library found through LD_LIBRARY_PATH.
CFLAGS_KVS=$(PKG_CONFIG_PATH=$PCDIR pkg-config --cflags kvslim)
LIBS_KVS=$(PKG_CONFIG_PATH=$PCDIR pkg-config --libs kvslim)
if cc -std=c11 -Wall -Wextra -Werror -pedantic -o "$TMP/generate-pc" \
    "$KVS_SOURCE_DIR/examples/generate.c" $CFLAGS_KVS $LIBS_KVS 2>"$TMP/cc.err"; then
  pass "cc generate.c \$(pkg-config --cflags --libs kvslim): $CFLAGS_KVS $LIBS_KVS"
  lib=$(LD_LIBRARY_PATH=$LIBDIR ldd "$TMP/generate-pc" | awk '/libkvslim/ { print $3 }')
  [ "$(readlink -f "$lib")" = "$(readlink -f "$LIBDIR/libkvslim.so")" ] &&
    pass "pkg-config build loads $lib" || fail "pkg-config build loads '$lib', not the prefix's"
  LD_LIBRARY_PATH=$LIBDIR check_run pkg-config "$TMP/generate-pc"
else
  fail "pkg-config build: $(head -c 600 "$TMP/cc.err")"
fi

# 2. find_package(kvslim): the shared build finds libkvslim.so through its RPATH, no
# LD_LIBRARY_PATH; the static build has no libkvslim dependency at all.
unset LD_LIBRARY_PATH
if cmake -S "$KVS_SOURCE_DIR/examples" -B "$TMP/ex" -DCMAKE_PREFIX_PATH="$PREFIX" \
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >"$TMP/ex.log" 2>&1 &&
   cmake --build "$TMP/ex" -j 2 >>"$TMP/ex.log" 2>&1; then
  pass "cmake -S examples with find_package(kvslim): generate, generate_static"
  lib=$(ldd "$TMP/ex/generate" | awk '/libkvslim/ { print $3 }')
  [ "$(readlink -f "$lib")" = "$(readlink -f "$LIBDIR/libkvslim.so")" ] &&
    pass "find_package build loads $lib (RPATH)" || fail "find_package build loads '$lib'"
  ldd "$TMP/ex/generate_static" | grep -q libkvslim &&
    fail "generate_static depends on libkvslim.so" || pass "generate_static: no libkvslim.so"
  check_run find_package "$TMP/ex/generate"
  check_run find_package-static "$TMP/ex/generate_static"
else
  fail "find_package build: $(tail -n 8 "$TMP/ex.log")"
fi
finish
