#!/usr/bin/env bash
# The best fidelity kvslim reaches within a KV memory target (issue 9: 10% of a full F16
# cache's bytes, mean during decode): every policy x storage type x budget below is evaluated
# with `kvslim eval` on a token file, the runs whose measured mean KV bytes stay within the
# target are ranked by KL, and the best few are printed.
#   scripts/memory_target.sh [BUILD_DIR] [TOKENS] [TARGET]
# Defaults: BUILD_DIR <repo>/build, TOKENS the sample-512 golden tokens, TARGET 0.10.
# Env: PROMPT_LEN (384), OUT (a results directory; default a temporary one, removed after).
# Prints a markdown table; the raw eval JSON stays in OUT when OUT is given.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
tokens=${2:-$here/../shared/models/golden/stories260K-sample-512.tokens}
target=${3:-0.10}
model=$here/../shared/models/gguf/stories260K-f32.gguf
prompt_len=${PROMPT_LEN:-384}
if [ -n "${OUT:-}" ]; then out=$OUT; mkdir -p "$out"; else out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi
types=(f16 kivi4 kivi2 kivi:kbits=4,vbits=4,residual=32 kivi:kbits=2,vbits=2,residual=32
       kivi:kbits=4,vbits=2,residual=32 kivi:kbits=2,vbits=4,residual=32)
budgets=0.05,0.08,0.1,0.12,0.15,0.2,0.25,0.3
i=0
for t in "${types[@]}"; do
  echo "eval on $t" >&2
  "$build/kvslim" eval -m "$model" --tokens "$tokens" --prompt-len "$prompt_len" \
    --kv streaming,h2o,tova,snapkv,nacl,knorm,quest --budget "$budgets" \
    --kv minicache --kv minicache:merge=mean --kv-type "$t" --json "$out/run$i.json" >/dev/null \
    2>"$out/run$i.err" || { cat "$out/run$i.err" >&2; exit 1; }
  i=$((i + 1))
done
python3 - "$target" "$out"/run*.json <<'PY'
import json, sys
target = float(sys.argv[1])
rows = []
for f in sys.argv[2:]:
    d = json.load(open(f))
    rows += d["rows"] if isinstance(d, dict) else d
fit = sorted((r for r in rows if r["kv_bytes_rel_f16"] <= target), key=lambda r: r["kl"])
print(f"{len(fit)} of {len(rows)} runs within {target:g} of the full F16 cache's bytes (mean during decode)\n")
print("| policy | kv_type | KV bytes vs full F16 | KL | top-1 |")
print("|---|---|---|---|---|")
for r in fit[:8]:
    print(f"| {r['params']} | {r['kv_type']} | {r['kv_bytes_rel_f16']:.4f} | {r['kl']:.4f} | {r['top1']:.3f} |")
PY
