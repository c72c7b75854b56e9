#!/usr/bin/env bash
# Retrieval under the two-party protocol (issue 12): the recall model answers the first N prompts
# of a recall set with the full cache, each through bench/mpc_fidelity (the three roles on
# threads, plain loopback channels): the context (every token before the question) prefilled in
# blocks, then `Q K_j` as single steps; the logits after K_j are opened in the harness and their
# argmax and margin (best minus second best) compared with the answer and with the plaintext
# engine's.
#   bench/mpc_recall.sh [BUILD_DIR]     (default BUILD_DIR: <repo>/build)
# Env: SET (recall-1024), N (20).
# Output: a markdown table on stdout, progress on stderr, BUILD_DIR/bench/mpc/recall-SET.json.
# A benchmark, not a test (a 1024-token prompt takes minutes).
set -euo pipefail
if [ -n "${CI:-}" ]; then
  echo "mpc_recall.sh: not run in CI (benchmark)" >&2
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
shared=$(cd "$here/../shared" && pwd)
set_name=${SET:-recall-1024}
n=${N:-20}
dir=$shared/models/recall/prompts/$set_name
[ -d "$dir" ] || { echo "mpc_recall.sh: no prompt set $dir" >&2; exit 2; }
out=$build/bench/mpc
mkdir -p "$out"
model=$out/recall.gguf
"$build/kvslim" convert "$shared/models/recall/recall.bin" \
  --tokenizer "$shared/models/recall/recall-tok.bin" -o "$model" >/dev/null
rows=()
i=0
# manifest columns: name tokens context n_pairs key answer answer_pos ...
while IFS=$'\t' read -r name tokens context _ _ answer answer_pos _; do
  [ "$name" = name ] && continue
  [ "$i" -lt "$n" ] || break
  i=$((i + 1))
  toks=$out/$set_name-$name.tokens
  # the prompt, then the answer: row answer_pos (the file's second-to-last) is scored last
  { cat "$dir/$name.tokens"; echo "$answer"; } > "$toks"
  [ "$answer_pos" = "$tokens" ] || [ "$answer_pos" = $((tokens - 1)) ] || {
    echo "mpc_recall.sh: $name: answer position $answer_pos is not the last token's" >&2; exit 1; }
  echo "mpc_recall: $set_name/$name ($i of $n), context $context" >&2
  t0=$SECONDS
  json=$("$build/mpc_fidelity" "$model" "$toks" "$context" 2>/dev/null)
  rows+=("$name|$answer|$((SECONDS - t0))|$json")
done < "$dir/manifest.tsv"
python3 - "$out/$set_name.json" "$set_name" "${rows[@]}" <<'PY'
import json, sys
dst, set_name, rows = sys.argv[1], sys.argv[2], []
for arg in sys.argv[3:]:
    name, answer, secs, js = arg.split("|", 3)
    r = json.loads(js)
    r.update(name=name, answer=int(answer), wall_s=int(secs))
    rows.append(r)
right = sum(r["last_argmax"] == r["answer"] for r in rows)
json.dump({"set": set_name, "prompts": len(rows), "right": right, "rows": rows},
          open(dst, "w"), indent=1)
print(f"{set_name} under the two-party protocol (full cache): {right} of {len(rows)} answers right\n")
print("| prompt | answer | secure argmax | secure margin | plaintext margin | wall s |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['name']} | {r['answer']} | {r['last_argmax']} | {r['last_margin']:.4f} | "
          f"{r['last_margin_plain']:.4f} | {r['wall_s']} |")
m = [r["last_margin"] for r in rows]
if m:
    print(f"\nmargin: min {min(m):.4f}, max {max(m):.4f}; mean wall {sum(r['wall_s'] for r in rows) / len(rows):.0f} s a prompt")
PY
