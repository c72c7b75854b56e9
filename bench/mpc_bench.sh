#!/usr/bin/env bash
# The two-party engine's cost per decoded token by context length (issue 12): for each context
# T, `kvslim mpc run` prefills the first T tokens of a token file, then feeds 4 teacher-forced
# decode steps and generates 1 token (a file with fewer than T + 4 tokens: generates 5, so 4
# decode steps follow the prefill); the table reports the decode steps' means — online bytes
# (both parties and each party's share, payload and wire), rounds, dealer bytes, loopback wall seconds, modelled LAN
# and WAN seconds — and the per-operation breakdown, beside the stories260K contexts and the
# recall model's; a table per operation (online bytes, rounds, dealer bytes); then the
# prefill's totals.
#   bench/mpc_bench.sh [BUILD_DIR]           (default BUILD_DIR: <repo>/build)
# Env: CONTEXTS ("128 256 512": stories260K), RECALL_CONTEXTS ("1024 2048": the recall model;
#      "" to skip), PLAIN (1: --insecure-plain, the loopback measurement; 0: encrypted).
# The prompt is prefilled in blocks (its rounds are those of one token), but its bytes and time
# still grow with T^2 through the attention: the 2048-token context takes about ten minutes.
# Output: a markdown table on stdout, progress on stderr, BUILD_DIR/bench/mpc/mpc.json.
# A benchmark, not a test.
set -euo pipefail
if [ -n "${CI:-}" ]; then
  echo "mpc_bench.sh: not run in CI (benchmark)" >&2
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
shared=$(cd "$here/../shared" && pwd)
contexts=${CONTEXTS:-128 256 512}
recall_contexts=${RECALL_CONTEXTS-1024 2048}
plain=${PLAIN:-1}
out=$build/bench/mpc
mkdir -p "$out"
kvslim=$out/kvslim
cp "$build/kvslim" "$kvslim"
flags=()
[ "$plain" = 1 ] && flags+=(--insecure-plain)
rows=()
run() { # MODEL_ARGS... -- TOKENS_SRC T NAME
  local name=$1 src=$2 t=$3; shift 3
  local toks=$out/$name-$t.tokens gen=1
  head -n $((t + 4)) "$src" > "$toks"
  local have
  have=$(wc -l < "$toks")
  if [ "$have" -lt "$t" ]; then
    echo "mpc_bench: $src has fewer than $t tokens; skipping $name at $t" >&2
    return 0
  fi
  # a file ending before t + 4 tokens: the decode steps generate (greedy) instead
  [ "$have" -lt $((t + 4)) ] && { head -n "$t" "$src" > "$toks"; gen=5; }
  echo "mpc_bench: $name, context $t" >&2
  "$kvslim" mpc run "$@" --tokens "$toks" --prompt-len "$t" -n "$gen" --timeout 600 \
    "${flags[@]}" --json "$out/$name-$t.json" >/dev/null
  rows+=("$name|$t|$out/$name-$t.json")
}
for t in $contexts; do
  run stories260K "$shared/models/golden/stories260K-sample-512.tokens" "$t" \
    -m "$shared/models/gguf/stories260K-f32.gguf"
done
for t in $recall_contexts; do
  src=$(ls "$shared"/models/recall/prompts/recall-4096/*.tokens | head -n 1)
  run recall "$src" "$t" -m "$shared/models/recall/recall.bin" \
    --tokenizer "$shared/models/recall/recall-tok.bin"
done
python3 - "$out/mpc.json" "$plain" "${rows[@]}" <<'PY'
import json, sys
dst, plain, rows = sys.argv[1], sys.argv[2] == "1", []
for arg in sys.argv[3:]:
    name, t, f = arg.split("|")
    r = json.load(open(f)); r["model_name"] = name; r["context"] = int(t); rows.append(r)
json.dump({"insecure_plain": plain, "rows": rows}, open(dst, "w"), indent=1)
kib = lambda b: f"{b / 1024:.1f} KiB"
mib = lambda b: f"{b / 2**20:.1f} MiB"
print(f"two-party decode per token, {'plain' if plain else 'AES-256-GCM'} channels, loopback, one run\n")
print("| model | context | online bytes | sent by party 0 / party 1 | wire bytes | rounds | dealer bytes | wall s | LAN s (model) | WAN s (model) | largest ops (bytes) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    ops = r.get("ops", {})
    items = ops.items() if isinstance(ops, dict) else [(o.get("op"), o) for o in ops]
    top = sorted(((k, v.get("bytes", 0)) for k, v in items), key=lambda x: -x[1])[:3]
    print(f"| {r['model_name']} | {r['context']} | {kib(r['online_bytes_per_token'])} | "
          f"{kib(r['online_bytes_party0_per_token'])} / {kib(r['online_bytes_party1_per_token'])} | "
          f"{kib(r['online_wire_bytes_per_token'])} | {r['rounds_per_token']:.0f} | "
          f"{mib(r['dealer_bytes_per_token'])} | {r['wall_s_per_token']:.3f} | "
          f"{r['lan_s_per_token']:.3f} | {r['wan_s_per_token']:.2f} | "
          + ", ".join(f"{k} {kib(b)}" for k, b in top) + " |")
print("\nper operation, per decoded token: online bytes (both parties) / rounds / dealer bytes\n")
names = ["matmul", "softmax", "rmsnorm", "silu", "argmax"]
print("| model | context | " + " | ".join(names) + " |")
print("|---|---|" + "---|" * len(names))
for r in rows:
    ops = r.get("ops", {})
    cell = lambda o: (f"{kib(ops[o]['bytes'])} / {ops[o]['rounds']:.0f} / {mib(ops[o].get('dealer_bytes', 0))}"
                      if o in ops else "-")
    print(f"| {r['model_name']} | {r['context']} | " + " | ".join(cell(o) for o in names) + " |")
print("\nthe prefill of the context (in blocks), totals\n")
print("| model | context | online bytes | rounds | dealer bytes | wall s | LAN s (model) | WAN s (model) |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    p = r["prefill"]
    print(f"| {r['model_name']} | {r['context']} | {mib(p['online_bytes'])} | {p['rounds']} | "
          f"{mib(p['dealer_bytes'])} | {p['wall_s']:.1f} | {p['lan_s']:.2f} | {p['wan_s']:.1f} |")
PY
