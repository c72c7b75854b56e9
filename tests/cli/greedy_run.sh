#!/usr/bin/env bash
# Greedy generation reproduces the golden text: 196 tokens from "Once upon a time".
source "$(dirname "$0")/lib.bash"
convert_model f32 "$TMP/ours-f32.gguf"
for model in "$MODELS/gguf/stories260K-f32.gguf" "$TMP/ours-f32.gguf" \
             "$MODELS/gguf/stories260K-f16.gguf"; do
  "$KVS_BIN" run -m "$model" -p "Once upon a time" -n 196 --temp 0 -t 2 \
    >"$TMP/text" 2>"$TMP/stats"
  # run ends its output with a newline that is not part of the generated text
  head -c -1 "$TMP/text" >"$TMP/gen"
  n=$(wc -c <"$TMP/gen")
  if [ "$n" -gt 400 ] && cmp -s "$TMP/gen" <(head -c "$n" "$GOLDEN/stories260K-greedy-512.txt"); then
    pass "$(basename "$model"): $n bytes identical to the golden text; $(cat "$TMP/stats")"
  else
    fail "$(basename "$model"): output ($n bytes) differs from the golden text"
    diff <(fold -w 80 "$TMP/gen") <(head -c "$n" "$GOLDEN/stories260K-greedy-512.txt" | fold -w 80) | head -5 || true
  fi
  grep -q "generated 196 tokens" "$TMP/stats" && pass "stats line: 196 tokens" || fail "stats line: $(cat "$TMP/stats")"
done
finish
