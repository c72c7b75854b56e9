#!/usr/bin/env bash
# Tokenizing the golden greedy text reproduces the golden token ids after BOS.
source "$(dirname "$0")/lib.bash"
convert_model f32 "$TMP/ours-f32.gguf"
head -c -1 "$GOLDEN/stories260K-greedy-512.txt" >"$TMP/text" # drop the file's final newline
tail -n +2 "$GOLDEN/stories260K-greedy-512.tokens" >"$TMP/want"
for model in "$TMP/ours-f32.gguf" "$MODELS/gguf/stories260K-f32.gguf"; do
  "$KVS_BIN" tokenize -m "$model" -f "$TMP/text" --no-bos >"$TMP/got"
  if cmp -s "$TMP/got" "$TMP/want"; then
    pass "$(basename "$model"): $(wc -l <"$TMP/got") ids identical"
  else
    fail "$(basename "$model"): ids differ"; diff "$TMP/got" "$TMP/want" | head -5 || true
  fi
done
"$KVS_BIN" tokenize -m "$TMP/ours-f32.gguf" -p "Once upon a time" >"$TMP/got"
[ "$(tr '\n' ' ' <"$TMP/got")" = "$(head -n 5 "$GOLDEN/stories260K-greedy-512.tokens" | tr '\n' ' ')" ] \
  && pass "prompt with BOS" || fail "prompt with BOS: $(tr '\n' ' ' <"$TMP/got")"
finish
