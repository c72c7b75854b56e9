# shellcheck shell=bash
# Shared by the benchmark drivers (sourced, not run).

# The 85.7M llama shape every long-context benchmark uses.
# shellcheck disable=SC2034 # used by the scripts that source this file
BENCH_SHAPE=dim=768,hidden=2048,layers=12,heads=12,kv_heads=12,vocab=512

# bench_synthetic KVSLIM OUT_DIR SHAPE CTX TYPE THREADS: prints the path of a synthetic model
# file of that shape, context and weight type in OUT_DIR, writing it first if it is missing
# (one file per context and type, so that runs minutes apart compare the same weights).
bench_synthetic() {
  local kvslim=$1 out=$2 shape=$3 ctx=$4 type=$5 threads=$6
  local model=$out/synthetic-$type-ctx$ctx.gguf
  if [ ! -f "$model" ]; then
    echo "writing $model" >&2
    "$kvslim" bench --synthetic "$shape,ctx=$ctx,type=$type" --save "$model" -p 16 -n 0 \
      -t "$threads" >/dev/null
  fi
  echo "$model"
}
