#!/usr/bin/env bash
# Every bad input exits non-zero with a message naming the problem, and never crashes.
source "$(dirname "$0")/lib.bash"
GGUF=$MODELS/gguf/stories260K-f32.gguf
TOKENS=$GOLDEN/stories260K-greedy-512.tokens

for cmd in run logits tokenize convert bench; do
  expect_fail "$cmd unknown flag" "unknown option '--bogus'" "$KVS_BIN" "$cmd" --bogus
  "$KVS_BIN" "$cmd" --help >"$TMP/help" && grep -q "usage: kvslim $cmd" "$TMP/help" \
    && pass "$cmd --help" || fail "$cmd --help"
done
expect_fail "unknown command" "unknown command 'frobnicate'" "$KVS_BIN" frobnicate
expect_fail "missing model" "$TMP/nope.gguf" "$KVS_BIN" run -m "$TMP/nope.gguf" -p hi
expect_fail "missing token file" "$TMP/nope.tokens" "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/nope.tokens" --out "$TMP/x"
expect_fail "bad number" "-n expects a whole number" "$KVS_BIN" run -m "$GGUF" -p hi -n ten
expect_fail "bad temperature" "--temp expects a number" "$KVS_BIN" run -m "$GGUF" -p hi --temp -1
expect_fail "threads zero" "-t expects a whole number" "$KVS_BIN" run -m "$GGUF" -p hi -t 0
expect_fail "flag without value" "-m needs a value" "$KVS_BIN" run -m

printf '1\n403\n512\n' >"$TMP/oov.tokens"
expect_fail "out-of-vocabulary id" "token id 512 (token 3 of the file) is outside the vocabulary" \
  "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/oov.tokens" --out "$TMP/x"
printf '1\n403\n99999999999\n' >"$TMP/huge.tokens"
expect_fail "huge id" "huge.tokens:3: expected a token id" \
  "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/huge.tokens" --out "$TMP/x"
printf '1\nhello\n' >"$TMP/text.tokens"
expect_fail "non-numeric id" "text.tokens:2: expected a token id" \
  "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/text.tokens" --out "$TMP/x"
seq 1 600 | sed 's/.*/5/' >"$TMP/long.tokens"
expect_fail "too many tokens" "exceed the model's context of 512" \
  "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/long.tokens" --out "$TMP/x"
[ ! -e "$TMP/x" ] && pass "no output file left behind" || fail "output file written on error"

ckpt=$MODELS/stories260K.bin
size=$(stat -c %s "$ckpt")
for cut in 0 4 27 28 29 100 4096 $((size / 2)) $((size - 4)) $((size - 1)); do
  head -c "$cut" "$ckpt" >"$TMP/cut.bin"
  expect_fail "checkpoint cut at $cut" "cut.bin" \
    "$KVS_BIN" convert "$TMP/cut.bin" --tokenizer "$MODELS/tok512.bin" -o "$TMP/out.gguf"
done
printf '\x40\x00\x00\x00\xac\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00' >"$TMP/hdr.bin"
tail -c +17 "$ckpt" >>"$TMP/hdr.bin"
expect_fail "checkpoint with n_heads 0" "n_heads = 0" \
  "$KVS_BIN" convert "$TMP/hdr.bin" --tokenizer "$MODELS/tok512.bin" -o "$TMP/out.gguf"
tsize=$(stat -c %s "$MODELS/tok512.bin")
for cut in 0 3 4 7 8 11 12 100 $((tsize / 2)) $((tsize - 1)); do
  head -c "$cut" "$MODELS/tok512.bin" >"$TMP/cut-tok.bin"
  expect_fail "tokenizer cut at $cut" "cut-tok.bin" \
    "$KVS_BIN" convert "$ckpt" --tokenizer "$TMP/cut-tok.bin" -o "$TMP/out.gguf"
done
[ ! -e "$TMP/out.gguf" ] && pass "no GGUF left behind" || fail "partial GGUF written"
expect_fail "convert into missing directory" "$TMP/no/such/dir" \
  "$KVS_BIN" convert "$ckpt" --tokenizer "$MODELS/tok512.bin" -o "$TMP/no/such/dir/x.gguf"

gsize=$(stat -c %s "$GGUF")
for cut in 0 3 8 23 24 100 1000 14000 $((gsize / 2)) $((gsize - 1)); do
  head -c "$cut" "$GGUF" >"$TMP/cut.gguf"
  expect_fail "GGUF cut at $cut" "cut.gguf" \
    "$KVS_BIN" logits -m "$TMP/cut.gguf" --tokens "$TOKENS" --out "$TMP/x"
done
finish
