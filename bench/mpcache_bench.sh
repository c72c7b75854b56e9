#!/usr/bin/env bash
# MPCache decode speed (issue 11): decode tok/s at an 8K prompt for the full F16 cache, quest,
# pqcache and mpcache at the same budget (default 5% of the prompt attended per step), with
# mpcache's time in selection (its report: scoring, top-k, sealing the tail) as a share of
# decode time, all in one run on one synthetic model file (the 85.7M llama shape).
#   bench/mpcache_bench.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build)
# Env: CONTEXT (8192), N_GEN (32), THREADS (2), TYPE (f32 weights), KV_TYPE (f16),
#      BUDGET (0.05), POLICIES (default: the four above; quest with dense_layers=0).
# Output: a markdown table on stdout, progress on stderr, BUILD_DIR/bench/mpcache/mpcache.json.
# A benchmark, not a test.
set -euo pipefail
if [ -n "${CI:-}" ]; then
  echo "mpcache_bench.sh: not run in CI (benchmark)" >&2
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/bench/lib.sh"
build=${1:-$here/build}
n=${CONTEXT:-8192} n_gen=${N_GEN:-32} threads=${THREADS:-2} type=${TYPE:-f32}
kv_type=${KV_TYPE:-f16} b=${BUDGET:-0.05}
shape=$BENCH_SHAPE
policies=${POLICIES:-full quest:budget=$b,dense_layers=0 pqcache:budget=$b mpcache:budget=$b}
out=$build/bench/mpcache
mkdir -p "$out"
# A copy of the binary, so that a rebuild during the run does not swap it mid-way.
kvslim=$out/kvslim
cp "$build/kvslim" "$kvslim"
ctx=$(( n + n_gen + 64 ))
model=$(bench_synthetic "$kvslim" "$out" "$shape" "$ctx" "$type" "$threads")
rows=()
for p in $policies; do
  name=$(echo "$p" | tr ':=,' '___')
  echo "prompt $n: --kv $p" >&2
  "$kvslim" bench -m "$model" -p "$n" -n "$n_gen" -t "$threads" --kv "$p" --kv-type "$kv_type" \
    --json "$out/$name.json" >/dev/null
  rows+=("$p|$out/$name.json")
done
python3 - "$out/mpcache.json" "$n" "$n_gen" "$threads" "$kv_type" "${rows[@]}" <<'PY'
import json, re, sys
dst, n, n_gen, threads, kv_type = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = []
for arg in sys.argv[6:]:
    p, f = arg.split("|")
    r = json.load(open(f)); r["policy"] = p
    rep = " ".join(r.get("policy_report", []))
    m = re.search(r"selection ([\d.]+) s in all", rep)
    r["select_s"] = float(m.group(1)) if m else None
    t_dec = r["n_gen"] / r["decode_tok_s"]
    r["select_share"] = r["select_s"] / t_dec if r["select_s"] is not None else None
    m = re.search(r"([\d.]+) slots attended per KV head", rep)
    r["slots_attended"] = float(m.group(1)) if m else None
    m = re.search(r"([\d.]+) s waited", rep)
    r["first_step_wait_s"] = float(m.group(1)) if m else None
    rows.append(r)
full = next((r for r in rows if r["policy"] == "full"), None)
for r in rows:
    r["decode_vs_full"] = r["decode_tok_s"] / full["decode_tok_s"] if full else None
json.dump({"n_prompt": n, "n_gen": n_gen, "threads": threads, "kv_type": kv_type, "rows": rows},
          open(dst, "w"), indent=1)
opt = lambda v, f: f.format(v) if v is not None else "-"
print(f"synthetic 85.7M, F32 weights, KV {kv_type}, prompt {n}, {n_gen} decoded, {threads} threads, one run\n")
print("| policy | prefill tok/s | decode tok/s | vs full | KV bytes | selection share of decode | report |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['policy']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | {opt(r['decode_vs_full'], '{:.2f}x')} "
          f"| {r['kv_bytes'] / 2**20:.1f} MiB | {opt(r['select_share'], '{:.1%}')} | {'; '.join(r.get('policy_report', []))[:160]} |")
PY
