#!/usr/bin/env bash
# MPCache under the two-party protocol (issue 13), every figure of the README's section:
#   1. the headline table: per decoded token, the full cache, the token-level baseline and
#      MPCache's steps one at a time, at contexts 512 (stories260K) and 1024, 2048, 4096 (the
#      recall model), budget 5% (bench/mpc_mpcache_bench.c);
#   2. the token-gather micro-benchmark of the paper's Table 2 (T 1024, C 64, 25% selected;
#      bench/mpc_gather_bench.c);
#   3. with CHECK=1 (about an hour): the choices, keep sets, logits and answers under the protocol
#      against the plaintext policy and the plaintext emulator (src/mpc/fx_llama.h) on the first N
#      prompts of recall-1024 (share=off, the model has two layers) and on stories260K's sample
#      (prompt 384, 128 teacher-forced rows), budgets 5% and 10% (bench/mpc_mpcache_check.c;
#      the protocol's results are kept in BUILD_DIR/bench/mpc/check-*.dump).
#   bench/mpc_mpcache.sh [BUILD_DIR]     (default BUILD_DIR: <repo>/build)
# Env: STEPS (4 decode steps a configuration), CHECK (0), N (20).
# Output: tables on stdout, progress on stderr, JSON in BUILD_DIR/bench/mpc/.
# A benchmark, not a test.
set -euo pipefail
if [ -n "${CI:-}" ]; then
  echo "mpc_mpcache.sh: not run in CI (benchmark)" >&2
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
shared=$(cd "$here/../shared" && pwd)
steps=${STEPS:-4}
out=$build/bench/mpc
mkdir -p "$out"
recall=$out/recall.gguf
"$build/kvslim" convert "$shared/models/recall/recall.bin" \
  --tokenizer "$shared/models/recall/recall-tok.bin" -o "$recall" >/dev/null
stories=$shared/models/gguf/stories260K-f32.gguf

echo "== 1. per decoded token, budget 5% ==" 
"$build/mpc_mpcache_bench" "$stories" 512 0.05 "$steps" --json "$out/mpcache-stories-512.json"
"$build/mpc_mpcache_bench" "$recall" 1024,2048,4096 0.05 "$steps" \
  --json "$out/mpcache-recall.json"

echo
echo "== 2. token-gather micro-benchmark (Table 2) =="
"$build/mpc_gather_bench" --json "$out/gather-table2.json"

if [ "${CHECK:-0}" = 1 ]; then
  echo
  echo "== 3. the protocol's choices against the plaintext policy =="
  MPCACHE_CHECK_DUMP=$out/check-recall-1024.dump "$build/mpc_mpcache_check" "$recall" \
    "$shared/models/recall/prompts/recall-1024" "${N:-20}" 0.05,0.1 share=off \
    >"$out/check-recall-1024.jsonl"
  MPCACHE_CHECK_DUMP=$out/check-stories.dump "$build/mpc_mpcache_check" "$stories" \
    "$shared/models/golden/stories260K-sample-512.tokens" 384 0.05,0.1 \
    >"$out/check-stories.jsonl"
fi
