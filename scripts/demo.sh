#!/usr/bin/env bash
# make demo: convert the reference llama2.c model to GGUF and generate a story.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
shared=${KVS_SHARED_DIR:-$here/../shared}
kvslim="$here/$build/kvslim"
model="$here/$build/stories260K.gguf"
"$kvslim" convert "$shared/models/stories260K.bin" --tokenizer "$shared/models/tok512.bin" \
  -o "$model" --type f32
echo
"$kvslim" run -m "$model" -p "Once upon a time" -n 256 --temp 0.8 --seed 42
