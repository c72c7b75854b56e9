#!/usr/bin/env bash
# Library checks as a CLI user meets them: a llama2.c checkpoint is named as such with the
# command that converts it; the --kv budget spellings; a fraction too small for the policy's
# protected tokens is raised instead of failing.
source "$(dirname "$0")/lib.bash"
GGUF=$MODELS/gguf/stories260K-f32.gguf
ckpt=$MODELS/stories260K.bin

expect_fail "llama2.c checkpoint given as a model" \
  "$ckpt is a llama2.c checkpoint, not a GGUF file; convert it with \`kvslim convert $ckpt --tokenizer TOK.bin -o OUT.gguf\`" \
  "$KVS_BIN" run -m "$ckpt" -p hi -n 1
# A file that only starts like one (its size does not match the header) is not called one.
head -c 4096 "$ckpt" >"$TMP/cut.bin"
expect_fail "cut checkpoint as a model" "bad magic" "$KVS_BIN" run -m "$TMP/cut.bin" -p hi -n 1
grep -q "llama2.c" "$TMP/err" && fail "cut checkpoint called a llama2.c checkpoint" \
  || pass "cut checkpoint not called a checkpoint"

expect_fail "budget=1 is ambiguous" "budget=1 is ambiguous: write budget=1.0 or budget=100% for the whole prompt, or slots=1 for one slot" \
  "$KVS_BIN" run -m "$GGUF" -p hi -n 1 --kv h2o:budget=1
expect_fail "budget=96 is ambiguous" "write slots=96 for 96 slots" \
  "$KVS_BIN" run -m "$GGUF" -p hi -n 1 --kv h2o:budget=96
expect_fail "duplicate key" "budget is given twice" \
  "$KVS_BIN" run -m "$GGUF" -p hi -n 1 --kv h2o:budget=0.1,budget=0.2
expect_fail "hex in a spec" "budget=0x1p-2" "$KVS_BIN" run -m "$GGUF" -p hi -n 1 --kv h2o:budget=0x1p-2
expect_fail "budget and slots" "not both" "$KVS_BIN" run -m "$GGUF" -p hi -n 1 --kv h2o:budget=0.5,slots=4
"$KVS_BIN" run -m "$GGUF" -p "Once upon a time" -n 4 --kv h2o:budget=25% >"$TMP/out" 2>"$TMP/err" \
  && pass "budget=25%" || fail "budget=25%: $(head -c 300 "$TMP/err")"
"$KVS_BIN" run -m "$GGUF" -p "Once upon a time" -n 4 --kv streaming:slots=16 >"$TMP/out" 2>"$TMP/err" \
  && pass "slots=16" || fail "slots=16: $(head -c 300 "$TMP/err")"

# 5 prompt tokens at 0.5 are 3 slots, fewer than StreamingLLM's 4 sinks + 1: raised, not refused.
"$KVS_BIN" run -m "$GGUF" -p "Once upon a time" -n 4 --kv streaming:budget=0.5 >"$TMP/out" 2>"$TMP/err" \
  && pass "fraction below the sinks is raised" || fail "streaming:budget=0.5: $(head -c 300 "$TMP/err")"
# An explicit slot count below them is the user's exact request: refused.
expect_fail "slots below the sinks" "leaves no room" \
  "$KVS_BIN" run -m "$GGUF" -p "Once upon a time" -n 4 --kv streaming:slots=3

# NaN weights (the file's last 256 bytes, inside its last tensor, set to 0xff: f32 NaN): eval
# fails naming the position instead of reporting KL 0 and top-1 1.000, and run fails too.
cp "$GGUF" "$TMP/nan.gguf"
size=$(stat -c %s "$TMP/nan.gguf")
head -c 256 /dev/zero | tr '\0' '\377' | dd of="$TMP/nan.gguf" bs=1 seek=$((size - 256)) conv=notrunc 2>/dev/null
expect_fail "eval with NaN weights" "non-finite logit .* at position" \
  "$KVS_BIN" eval -m "$TMP/nan.gguf" --tokens "$GOLDEN/stories260K-sample-512.tokens" \
  --prompt-len 100 --kv full --kv streaming:budget=0.25
grep -q "| 1.000 |" "$TMP/out" && fail "eval printed a top-1 of 1.000 for NaN logits" \
  || pass "no perfect scores printed for NaN logits"
expect_fail "run with NaN weights" "non-finite logit" "$KVS_BIN" run -m "$TMP/nan.gguf" -p "Once upon" -n 3
finish
