#!/usr/bin/env bash
# The one flag table: every form of a flag (--f v, --f=v, -n 5, -n5), repeated flags refused,
# one decimal number parser with limits as the user writes them, --version, the --kv-type check
# the same everywhere, and the run command's order: validate, then echo, then generate.
source "$(dirname "$0")/lib.bash"
GGUF=$MODELS/gguf/stories260K-f32.gguf
R=("$KVS_BIN" run -m "$GGUF" -p "Once upon a time")

# --version, at the top and per command.
for args in "--version" "run --version" "eval --version" "bench --version"; do
  out=$("$KVS_BIN" $args 2>&1) && [[ "$out" =~ ^kvslim\ [0-9]+\.[0-9]+\.[0-9]+$ ]] \
    && pass "$args: $out" || fail "$args: '$out'"
done

# Every spelling of a value gives the same run.
"${R[@]}" -n 8 --temp 0 >"$TMP/a" 2>/dev/null || fail "run -n 8 --temp 0"
"${R[@]}" -n8 --temp=0 >"$TMP/b" 2>/dev/null || fail "run -n8 --temp=0"
"${R[@]}" --n-predict=8 --temp=0 >"$TMP/c" 2>/dev/null || fail "run --n-predict=8"
[ -s "$TMP/a" ] && cmp -s "$TMP/a" "$TMP/b" && cmp -s "$TMP/a" "$TMP/c" \
  && pass "-n 8, -n8 and --n-predict=8 agree" || fail "spellings differ: $(cat "$TMP/a" "$TMP/b")"

# Repeated flags are refused, not resolved by the last one.
expect_fail "repeated --temp" "--temp given twice" "${R[@]}" --temp 1 --temp 0
expect_fail "-t and --threads" "--threads given twice (as -t and --threads)" "${R[@]}" -t 1 --threads 2
expect_fail "repeated -m" "-m given twice" "$KVS_BIN" eval -m "$GGUF" -m "$GGUF"
expect_fail "repeated --budget" "--budget given twice" "$KVS_BIN" eval --budget 0.1 --budget 0.2
expect_fail "switch with a value" "--no-bos takes no value" "$KVS_BIN" tokenize --no-bos=1

# One number parser: decimal only, everywhere; limits printed in full.
expect_fail "hex -n" "-n expects a whole number in \[0, 16777216\], got '0x10'" "${R[@]}" -n 0x10
expect_fail "hex --temp" "--temp expects a number in \[0, 100\], got '0x1p-1'" "${R[@]}" --temp 0x1p-1
expect_fail "inf --top-p" "--top-p expects a number" "${R[@]}" --top-p inf
expect_fail "hex --seed" "--seed expects a non-negative whole number, got '0x2a'" "${R[@]}" --seed 0x2a
expect_fail "--chunk limit" "--chunk expects a whole number in \[1, 1048576\], got '2000000'" \
  "${R[@]}" --chunk 2000000
grep -q 'e+' "$TMP/err" && fail "limit in %g: $(cat "$TMP/err")" || pass "no %g in limits"
expect_fail "bench -p attached" "-p expects a whole number in \[1, 4194304\], got 'x'" \
  "$KVS_BIN" bench -px --synthetic dim=64
expect_fail "synthetic hex" "--synthetic dim expects a whole number in \[1, 65536\], got '0x40'" \
  "$KVS_BIN" bench --synthetic dim=0x40 -p 4 -n 1
expect_fail "synthetic key twice" "--synthetic: dim given twice" \
  "$KVS_BIN" bench --synthetic dim=64,dim=32,hidden=64,layers=1,heads=2,vocab=64 -p 4 -n 1

# --kv-type is checked in one place: the same message for every command.
for cmd in run logits bench eval; do
  expect_fail "$cmd --kv-type q9" "kvslim $cmd: --kv-type: unknown type 'q9' (expected f32, f16, kivi4, kivi2, kivi:...)" \
    "$KVS_BIN" "$cmd" --kv-type q9
done

# Help comes from the same table: every command lists its options and --version.
for cmd in run logits tokenize convert bench eval; do
  "$KVS_BIN" "$cmd" --help >"$TMP/help" && grep -q "usage: kvslim $cmd" "$TMP/help" \
    && grep -q -- "--version" "$TMP/help" && grep -q -- "-h, --help" "$TMP/help" \
    && pass "$cmd --help" || fail "$cmd --help"
done

# No option is declared twice for one command (a second row would never be reached).
for cmd in run logits tokenize convert bench eval; do
  dups=$("$KVS_BIN" "$cmd" --help | grep -oE '^  (-[a-z], )?--[a-z-]+' | sed 's/^ *//' \
    | tr ',' '\n' | sed 's/^ *//' | sort | uniq -d)
  [ -z "$dups" ] && pass "$cmd: no option declared twice" || fail "$cmd declares twice: $dups"
done
"$KVS_BIN" eval --kv=help >"$TMP/kvhelp" && grep -q '^streaming ' "$TMP/kvhelp" && pass "--kv=help" || fail "--kv=help"

# More threads than online CPUs: clamped with a notice.
cpus=$(getconf _NPROCESSORS_ONLN)
if [ "$cpus" -lt 256 ]; then
  "${R[@]}" -n 2 -t 256 >/dev/null 2>"$TMP/err" \
    && grep -q "kvslim run: -t 256 is more than the $cpus online CPUs*; using $cpus" "$TMP/err" \
    && pass "threads clamped: $(head -n 1 "$TMP/err")" || fail "threads: $(cat "$TMP/err")"
fi

# run: a prompt the session refuses is bad usage (2), and nothing is echoed before the error.
status=0
"$KVS_BIN" run -m "$GGUF" -p "Once upon a time there was a girl" -c 4 >"$TMP/out" 2>"$TMP/err" \
  || status=$?
[ "$status" = 2 ] && [ ! -s "$TMP/out" ] && grep -q '^kvslim run: a prompt of .* exceeds the context' "$TMP/err" \
  && pass "prompt over the context: exit 2, nothing echoed" \
  || fail "prompt over the context: exit $status, stdout '$(cat "$TMP/out")', stderr '$(cat "$TMP/err")'"

# run: generation that stops at the context's end says so.
"${R[@]}" -c 16 -n 100 --temp 0 >"$TMP/out" 2>"$TMP/err" \
  && grep -q "stopped: the context of 16 tokens is full" "$TMP/err" \
  && pass "context full: $(grep stopped "$TMP/err")" || fail "context full: $(cat "$TMP/err")"
"${R[@]}" -n 3 --temp 0 >/dev/null 2>"$TMP/err" && ! grep -q stopped "$TMP/err" \
  && pass "no context notice when -n ends it" || fail "notice without reason: $(cat "$TMP/err")"
finish
