#!/usr/bin/env bash
# make demo: convert the reference llama2.c model to GGUF, generate a story, then show the full
# cache beside a compressed one on the same long prompt: text, KV bytes and fidelity (KL).
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
shared=${KVS_SHARED_DIR:-$here/../shared}
kvslim="$here/$build/kvslim"
model="$here/$build/stories260K.gguf"
policy=${DEMO_POLICY:-snapkv:budget=0.25}
out="$here/$build/demo"
mkdir -p "$out"

"$kvslim" convert "$shared/models/stories260K.bin" --tokenizer "$shared/models/tok512.bin" \
  -o "$model" --type f32
echo
echo "== A story from \"Once upon a time\" (temperature 0.8, seed 42)"
"$kvslim" run -m "$model" -p "Once upon a time" -n 200 --temp 0.8 --seed 42

# A long prompt: the first ~800 bytes of the shared evaluation prose (about 350 tokens).
head -c 800 "$shared/models/stories-eval.txt" | sed '$ s/[^.]*$//' >"$out/prompt.txt"
echo
echo "== Full cache vs $policy on a $(wc -c <"$out/prompt.txt")-byte prompt, greedy, 60 tokens"
for kv in full "$policy"; do
  "$kvslim" run -m "$model" -f "$out/prompt.txt" -n 60 --temp 0 --kv "$kv" \
    >"$out/$kv.txt" 2>"$out/$kv.stats"
done
for kv in full "$policy"; do
  echo "-- $kv: $(cat "$out/$kv.stats")"
  tail -c +"$(( $(wc -c <"$out/prompt.txt") + 1 ))" "$out/$kv.txt" | fold -s -w 100
done
echo
echo "== Fidelity against the full cache (teacher-forced, prompt 384 of the 512 golden tokens),"
echo "   with F32 and with KIVI 4-bit KV storage"
"$kvslim" eval -m "$model" --tokens "$shared/models/golden/stories260K-sample-512.tokens" \
  --prompt-len 384 --kv full --kv "$policy" --kv streaming:budget=0.25 --kv-type f32,kivi4
