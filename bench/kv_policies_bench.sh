#!/usr/bin/env bash
# Decode speed and KV bytes per policy at long context, on one synthetic model file.
#   bench/kv_policies_bench.sh [BUILD_DIR]
# Env: N_PROMPT (8192), N_GEN (64), THREADS (2), BUDGET (0.1; N for slots=N), TYPE (f32), KV_TYPE (f32),
#      POLICIES ("full streaming h2o snapkv quest").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
kvslim=$build/kvslim
n_prompt=${N_PROMPT:-8192} n_gen=${N_GEN:-64} threads=${THREADS:-2} budget=${BUDGET:-0.1}
# A fraction (0.1, 10%) is budget=F; a whole number N is slots=N.
case $budget in *.* | *%) b_item="budget=$budget" ;; *) b_item="slots=$budget" ;; esac
type=${TYPE:-f32} kv_type=${KV_TYPE:-f32}
policies=${POLICIES:-full streaming h2o tova snapkv quest nacl hashevict}
out=$build/bench/kv-policies
mkdir -p "$out"
ctx=$(( n_prompt + n_gen + 64 ))
model=$out/synthetic-$type-ctx$ctx.gguf
shape=dim=768,hidden=2048,layers=12,heads=12,kv_heads=12,vocab=512,ctx=$ctx,type=$type
if [ ! -f "$model" ]; then
  echo "writing $model" >&2
  "$kvslim" bench --synthetic "$shape" --save "$model" -p 16 -n 0 -t "$threads" >/dev/null
fi
echo "synthetic 85.7M ($type weights, KV $kv_type), prompt $n_prompt, $n_gen decoded, $threads threads, budget $budget"
echo
echo "| policy | prefill tok/s | prefill time in policy hooks | decode tok/s | decode vs full | decode time in KV layer | KV bytes at end | KV peak | peak RSS |"
echo "|---|---|---|---|---|---|---|---|---|"
full_decode=""
for p in $policies; do
  spec=$p; [ "$p" = full ] || spec="$p:$b_item"
  echo "running $spec" >&2
  "$kvslim" bench -m "$model" -p "$n_prompt" -n "$n_gen" -t "$threads" --kv "$spec" \
    --kv-type "$kv_type" --json "$out/$p.json" >/dev/null
  python3 - "$out/$p.json" "$spec" "${full_decode:-0}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); full = float(sys.argv[3])
mib = lambda b: f"{b / 2**20:.1f} MiB"
ratio = f"{r['decode_tok_s'] / full:.2f}x" if full else "1.00x"
print(f"| {sys.argv[2]} | {r['prefill_tok_s']:.1f} | {100 * r['prefill_policy_share']:.1f}% | "
      f"{r['decode_tok_s']:.1f} | {ratio} | "
      f"{100 * r['decode_kv_share']:.1f}% | {mib(r['kv_bytes'])} | {mib(r['kv_bytes_peak'])} | "
      f"{mib(r['peak_rss_bytes'])} |")
PY
  [ "$p" = full ] && full_decode=$(python3 -c "import json;print(json.load(open('$out/full.json'))['decode_tok_s'])")
done
