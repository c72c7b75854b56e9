#!/usr/bin/env bash
# A context whose full F16 cache does not fit under a memory limit, run to the end by PQCache
# with its slow tier in a file (issue 10): the synthetic 85.7M llama, a 32K prompt (full F16
# cache about 1.2 GB) and 16 decoded tokens under a memory cgroup of LIMIT (1 GiB) where the
# machine allows one (cgroup v2 memory.max or v1 memory.limit_in_bytes; the tier file's page
# cache is charged to it too), else under `ulimit -v` (the tier is read with pread, so no big
# mapping is needed). Reports peak RSS against the full cache's bytes, and the same run with
# the full cache, which the limit stops.
#   bench/pqcache_bounded.sh [BUILD_DIR]   (env: N_PROMPT 32768, CHUNK 512, LIMIT_MIB 1024,
#                                           SPEC pqcache:budget=0.1, TIER_DIR $BUILD_DIR/bench)
set -euo pipefail
if [ -n "${CI:-}" ]; then
  echo "pqcache_bounded.sh: not run in CI (benchmark)" >&2
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
kvslim=$build/kvslim
n_prompt=${N_PROMPT:-32768} chunk=${CHUNK:-512} limit_mib=${LIMIT_MIB:-1024}
spec=${SPEC:-pqcache:budget=0.1}
shape=dim=768,hidden=2048,layers=12,heads=12,kv_heads=12,vocab=512
out=$build/bench/pqcache
tier_dir=${TIER_DIR:-$out}
mkdir -p "$out" "$tier_dir"
ctx=$(( n_prompt + 64 ))
model=$out/synthetic-f32-ctx$ctx.gguf
[ -f "$model" ] || "$kvslim" bench --synthetic "$shape,ctx=$ctx,type=f32" --save "$model" -p 16 \
  -n 0 >/dev/null
limit=$(( limit_mib * 1024 * 1024 ))

# The limit: a fresh memory cgroup (v2, then v1), else ulimit -v.
cg="" how=""
if [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  cg=/sys/fs/cgroup/kvslim-pqcache-$$
  mkdir "$cg" && echo "$limit" >"$cg/memory.max" && echo 0 >"$cg/memory.swap.max" 2>/dev/null || true
  how="cgroup v2 memory.max = $limit_mib MiB"
elif [ -d /sys/fs/cgroup/memory ] && mkdir /sys/fs/cgroup/memory/kvslim-pqcache-$$ 2>/dev/null; then
  cg=/sys/fs/cgroup/memory/kvslim-pqcache-$$
  echo "$limit" >"$cg/memory.limit_in_bytes"
  echo "$limit" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
  how="cgroup v1 memory.limit_in_bytes = $limit_mib MiB"
else
  how="ulimit -v $limit_mib MiB (no memory cgroup here)"
fi
cleanup() { [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT

# Runs kvslim bench under the limit; prints its exit status.
limited() {
  if [ -n "$cg" ]; then
    bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$@"
  else
    bash -c 'ulimit -v $(( '"$limit_mib"' * 1024 )) && exec "$@"' _ "$@"
  fi
}

echo "synthetic 85.7M (F32 weights, 327 MiB), prompt $n_prompt, chunk $chunk, 16 decoded, 2 threads, F16 KV; limit: $how"
echo
echo "| run | exit | prefill tok/s | decode tok/s | KV bytes (fast tier) | full F16 cache | peak RSS | peak RSS / full cache | slow tier |"
echo "|---|---|---|---|---|---|---|---|---|"
for s in "$spec,tier=$tier_dir/pqcache-tier.bin" full; do
  rm -f "$out/bounded.json"
  set +e
  limited "$kvslim" bench -m "$model" -p "$n_prompt" -n 16 --chunk "$chunk" -t 2 --kv-type f16 \
    --kv "$s" --json "$out/bounded.json" >/dev/null 2>"$out/bounded.err"
  rc=$?
  set -e
  if [ -s "$out/bounded.json" ]; then
    python3 - "$out/bounded.json" "$s" "$rc" "$n_prompt" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1])); n = int(sys.argv[4])
full = n * 12 * 2 * 768 * 2
tier = next((re.search(r"slow tier \(\w+\): ([\d.]+) MiB", l).group(1) for l in r.get("policy_report", []) if "slow tier" in l), "-")
mib = lambda b: f"{b / 2**20:.1f} MiB"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | {mib(r['kv_bytes'])} "
      f"| {mib(full)} | {mib(r['peak_rss_bytes'])} | {r['peak_rss_bytes'] / full:.3f} | {tier} MiB |")
PY
  else
    echo "| $s | $rc | - | - | - | - | - | - | stopped: $(tail -c 200 "$out/bounded.err" | tr '\n|' '  ') |"
  fi
  [ -e "$tier_dir/pqcache-tier.bin" ] && echo "tier file left behind: $tier_dir/pqcache-tier.bin" >&2
done
if [ -n "$cg" ] && [ -f "$cg/memory.max_usage_in_bytes" ]; then
  echo
  echo "cgroup peak usage (includes the tier file's page cache): $(( $(cat "$cg/memory.max_usage_in_bytes") / 1048576 )) MiB"
elif [ -n "$cg" ] && [ -f "$cg/memory.peak" ]; then
  echo
  echo "cgroup peak usage (includes the tier file's page cache): $(( $(cat "$cg/memory.peak") / 1048576 )) MiB"
fi
