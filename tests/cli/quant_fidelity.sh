#!/usr/bin/env bash
# Quantised models against the golden fp32 logits: top-1 agreement >= 99.5% (F16), >= 98%
# (Q8_0); BF16 and Q4_0 are reported. Both token files, ours and llama.cpp's GGUFs.
source "$(dirname "$0")/lib.bash"
cat_tokens() { cat "$GOLDEN/stories260K-greedy-512.tokens" "$GOLDEN/stories260K-sample-512.tokens"; }
for type in f16 bf16 q8_0 q4_0; do convert_model "$type" "$TMP/ours-$type.gguf"; done
check() { # model min_top1 label
  for set in greedy sample; do
    "$KVS_BIN" logits -m "$1" --tokens "$GOLDEN/stories260K-$set-512.tokens" --out "$TMP/$set.f32" -t 2
  done
  cat "$TMP/greedy.f32" "$TMP/sample.f32" >"$TMP/all.f32"
  cat "$GOLDEN/stories260K-greedy-512.logits.f32" "$GOLDEN/stories260K-sample-512.logits.f32" >"$TMP/golden.f32"
  if "$COMPARE" "$TMP/golden.f32" "$TMP/all.f32" 512 --min-top1 "$2" --label "$3"; then pass "$3"; else fail "$3"; fi
}
check "$TMP/ours-f16.gguf" 0.995 "kvslim f16"
check "$MODELS/gguf/stories260K-f16.gguf" 0.995 "llama.cpp f16"
check "$TMP/ours-q8_0.gguf" 0.98 "kvslim q8_0"
check "$MODELS/gguf/stories260K-q8_0.gguf" 0.98 "llama.cpp q8_0"
check "$TMP/ours-bf16.gguf" 0 "kvslim bf16"
check "$TMP/ours-q4_0.gguf" 0 "kvslim q4_0"
finish
