#!/usr/bin/env bash
# kvslim logits matches the golden fp32 logits to 1e-4 at every position, for our converted
# F32 GGUF and for llama.cpp's, in one batch and in chunks of 64.
source "$(dirname "$0")/lib.bash"
convert_model f32 "$TMP/ours-f32.gguf"
for model in "$TMP/ours-f32.gguf" "$MODELS/gguf/stories260K-f32.gguf"; do
  for set in greedy sample; do
    for chunk in 512 64; do
      out="$TMP/logits.f32"
      "$KVS_BIN" logits -m "$model" --tokens "$GOLDEN/stories260K-$set-512.tokens" --out "$out" \
        --chunk "$chunk" -t 2
      label="$(basename "$model") $set chunk $chunk"
      if "$COMPARE" "$GOLDEN/stories260K-$set-512.logits.f32" "$out" 512 --max-abs 1e-4 \
        --label "$label"; then pass "$label"; else fail "$label"; fi
    done
  done
done
finish
