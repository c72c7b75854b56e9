#!/usr/bin/env bash
# KIVI storage at long context: decode speed, KV bytes and the share of decode time in the KV
# layer, for f32, f16, kivi4 and kivi2 storage under the full cache and under
# snapkv:budget=0.1 (and minicache on kivi4 when the binary has that policy), all measured in
# one run on one synthetic model file so that the ratios compare runs made minutes apart.
#   bench/kivi_bench.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build)
# Env: N_PROMPT (8192), N_GEN (64), THREADS (2), TYPE (f32: the weights),
#      SHAPE (BENCH_SHAPE of bench/lib.sh: the 85.7M llama),
#      KV_TYPES ("f32 f16 kivi4 kivi2"), POLICIES ("full snapkv:budget=0.1"),
#      ROUNDS (1: rounds of every configuration in turn; the table shows medians, so that a
#      burst of load from other processes moves one round, not the comparison).
# Output: a markdown table on stdout, progress on stderr, BUILD_DIR/bench/kivi/kivi.json (one
# row per configuration, with the raw `kvslim bench --json` fields). A benchmark, not a test.
set -euo pipefail
if [ -n "${CI:-}" ]; then
  echo "kivi_bench.sh: not run in CI (benchmark)" >&2
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/bench/lib.sh"
build=${1:-$here/build}
kvslim=$build/kvslim
n_prompt=${N_PROMPT:-8192} n_gen=${N_GEN:-64} threads=${THREADS:-2} type=${TYPE:-f32}
shape_base=${SHAPE:-$BENCH_SHAPE}
kv_types=${KV_TYPES:-f32 f16 kivi4 kivi2}
policies=${POLICIES:-full snapkv:budget=0.1}
rounds=${ROUNDS:-1}
out=$build/bench/kivi
mkdir -p "$out"
ctx=$(( n_prompt + n_gen + 64 ))
model=$(bench_synthetic "$kvslim" "$out" "$shape_base" "$ctx" "$type" "$threads")
# Configurations: every storage type under every policy, then minicache on kivi4 if known.
configs=()
for p in $policies; do
  for t in $kv_types; do configs+=("$p|$t"); done
done
if "$kvslim" bench --kv help 2>&1 | grep -q '^ *minicache'; then
  configs+=("minicache|kivi4")
else
  echo "minicache: not a policy of this binary, skipped" >&2
fi
rows=()
for round in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    p=${c%%|*} t=${c#*|}
    name=$(echo "$p-$t" | tr ':=,' '___')-r$round
    echo "round $round: --kv $p --kv-type $t" >&2
    "$kvslim" bench -m "$model" -p "$n_prompt" -n "$n_gen" -t "$threads" --kv "$p" --kv-type "$t" \
      --json "$out/$name.json" >/dev/null
    rows+=("$p|$t|$out/$name.json")
  done
done
python3 - "$out/kivi.json" "$n_prompt" "$n_gen" "$threads" "${rows[@]}" <<'PY'
import json, statistics, sys
dst, n_prompt, n_gen, threads = sys.argv[1], *map(int, sys.argv[2:5])
runs = {}
for arg in sys.argv[5:]:
    p, t, f = arg.split("|")
    runs.setdefault((p, t), []).append(json.load(open(f)))
rows = []
for (p, t), rs in runs.items():
    med = lambda k: statistics.median(r[k] for r in rs)
    rows.append({"policy": p, "kv_type": t, "rounds": rs,
                 **{k: med(k) for k in ("prefill_tok_s", "decode_tok_s", "decode_kv_share")},
                 "kv_bytes": rs[-1]["kv_bytes"], "kv_bytes_peak": rs[-1]["kv_bytes_peak"]})
base = {r["policy"]: r for r in rows if r["kv_type"] == "f16"}
f16_full = next((r for r in rows if r["policy"] == "full" and r["kv_type"] == "f16"), None)
for r in rows:
    b = base.get(r["policy"], f16_full)
    r["decode_vs_f16"] = r["decode_tok_s"] / b["decode_tok_s"] if b else None
    r["kv_bytes_vs_full_f16"] = r["kv_bytes"] / f16_full["kv_bytes"] if f16_full else None
json.dump({"n_prompt": n_prompt, "n_gen": n_gen, "threads": threads, "rows": rows},
          open(dst, "w"), indent=1)
mib = lambda b: f"{b / 2**20:.1f} MiB"
n_rounds = max(len(r["rounds"]) for r in rows)
print(f"synthetic 85.7M, prompt {n_prompt}, {n_gen} decoded, {threads} threads, "
      f"{n_rounds} round(s) in one run (medians)\n")
print("| policy | KV type | prefill tok/s | decode tok/s | decode vs f16 (same policy) "
      "| decode time in KV layer | KV bytes at end | vs full F16 |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    v = r["decode_vs_f16"]; k = r["kv_bytes_vs_full_f16"]
    print(f"| {r['policy']} | {r['kv_type']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | "
          f"{f'{v:.2f}x' if v else '-'} | {100 * r['decode_kv_share']:.1f}% | "
          f"{mib(r['kv_bytes'])} | {f'{k:.3f}' if k else '-'} |")
PY
