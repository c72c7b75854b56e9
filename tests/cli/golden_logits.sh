#!/usr/bin/env bash
# kvslim logits matches the golden fp32 logits to 1e-4 at every position, for our converted
# F32 GGUF and for llama.cpp's, in one batch and in chunks of 64; and with --exact-matmul a
# K-quant file of ../shared/models/arch matches llama.cpp's logits on its dequantised weights
# (which the default 8-bit activations do not, to 1e-4).
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
ARCH=$MODELS/arch
out="$TMP/arch.f32"
"$KVS_BIN" logits -m "$ARCH/llama3-q4_k_m.gguf" --tokens "$ARCH/seq128.tokens" --out "$out" \
  --exact-matmul -t 2
if "$COMPARE" "$ARCH/llama3-q4_k_m.deq.logits.f32" "$out" 128 --max-abs 1e-4 \
  --label "llama3-q4_k_m --exact-matmul vs .deq"; then pass "--exact-matmul"
else fail "--exact-matmul"; fi
"$KVS_BIN" logits -m "$ARCH/llama3-q4_k_m.gguf" --tokens "$ARCH/seq128.tokens" --out "$out" -t 2
if "$COMPARE" "$ARCH/llama3-q4_k_m.deq.logits.f32" "$out" 128 --max-abs 1e-4 \
  --label "llama3-q4_k_m default vs .deq (must differ)" >/dev/null 2>&1; then
  fail "default 8-bit activations equal the fp32 reference to 1e-4: is --exact-matmul ignored?"
else pass "default differs from the fp32 reference (8-bit activations)"; fi
finish
