#!/usr/bin/env bash
# KL of seeded policies over several seeds (mean ± sd), on the eval protocol.
#   scripts/seed_spread.sh BUILD_DIR PROMPT_LEN SPEC [SPEC ...]     (env: SEEDS "0 1 ... 9",
#   BUDGETS "0.1,0.25,0.5", TOKENS, MODEL)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$1 prompt=$2; shift 2
shared=${KVS_SHARED_DIR:-$here/../shared}
model=${MODEL:-$shared/models/gguf/stories260K-f32.gguf}
tokens=${TOKENS:-$shared/models/golden/stories260K-sample-512.tokens}
seeds=${SEEDS:-0 1 2 3 4 5 6 7 8 9}
budgets=${BUDGETS:-0.1,0.25,0.5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for seed in $seeds; do
  args=()
  for spec in "$@"; do
    case $spec in *:*) args+=(--kv "$spec,seed=$seed") ;; *) args+=(--kv "$spec:seed=$seed") ;; esac
  done
  "$build/kvslim" eval -m "$model" --tokens "$tokens" --prompt-len "$prompt" "${args[@]}" \
    --budget "$budgets" --json "$tmp/$seed.json" >/dev/null 2>&1
done
echo "KL over seeds {$seeds}, prompt $prompt: mean ± sd"
echo
echo "| policy | $(echo "$budgets" | sed 's/,/ | /g') |"
echo "|---|$(echo "$budgets" | sed 's/[^,]*/---|/g; s/,//g')"
jq -s -r --arg budgets "$budgets" '
  [.[][] | select(.policy != "full") | {p: (.params | sub(",?seed=[0-9]+"; "") | sub(":$"; "")
     | sub("(budget|slots)=[^,]*,?"; "") | sub(":$"; "")), b: .budget, kl: .kl}]
  | group_by(.p)[] | . as $g
  | ($budgets | split(",") | map(tonumber)) as $bs
  | "| \($g[0].p) | " + ([$bs[] as $b | [$g[] | select(.b == $b) | .kl] as $k
      | ($k | add / length) as $m
      | (($k | map((. - $m) * (. - $m)) | add) / (($k | length) - 1) | sqrt) as $sd
      | "\($m * 10000 | round / 10000) ± \($sd * 10000 | round / 10000)"] | join(" | ")) + " |"
' "$tmp"/*.json
