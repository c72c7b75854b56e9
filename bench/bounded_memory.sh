#!/usr/bin/env bash
# Peak KV bytes and RSS on a prompt far longer than the budget: evicting policies stay within
# (budget + chunk) x bytes per token, the full cache grows with the prompt.
#   bench/bounded_memory.sh [BUILD_DIR]   (env: N_PROMPT 16384, BUDGET 1024 slots, CHUNK 512)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
kvslim=$build/kvslim
n_prompt=${N_PROMPT:-16384} budget=${BUDGET:-1024} chunk=${CHUNK:-512}
shape=dim=512,hidden=1024,layers=8,heads=8,kv_heads=8,vocab=512,ctx=32768
out=$build/bench/bounded
mkdir -p "$out"
model=$out/synthetic-ctx32768.gguf
[ -f "$model" ] || "$kvslim" bench --synthetic "$shape" --save "$model" -p 16 -n 0 >/dev/null
echo "synthetic $shape, prompt $n_prompt random tokens, chunk $chunk, 16 decoded, 2 threads"
echo
echo "| policy | KV bytes at end | peak KV bytes | (budget + chunk) x bytes/token | peak RSS | decode tok/s |"
echo "|---|---|---|---|---|---|"
for spec in "streaming:slots=$budget" "h2o:slots=$budget" full; do
  "$kvslim" bench -m "$model" -p "$n_prompt" -n 16 --chunk "$chunk" -t 2 --kv-type f32 --kv "$spec" \
    --json "$out/b.json" >/dev/null
  python3 - "$out/b.json" "$spec" "$budget" "$chunk" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); spec = sys.argv[2]
meta = 1 if spec.startswith("h2o") else 0
per_token = 8 * 8 * (2 * 64 * 4 + 4 + 4 * meta)   # layers x KV heads x slot bytes
limit = "-" if spec == "full" else f"{(int(sys.argv[3]) + int(sys.argv[4])) * per_token / 2**20:.2f} MiB"
mib = lambda b: f"{b / 2**20:.2f} MiB"
print(f"| {spec} | {mib(r['kv_bytes'])} | {mib(r['kv_bytes_peak'])} | {limit} | "
      f"{mib(r['peak_rss_bytes'])} | {r['decode_tok_s']:.1f} |")
PY
done
