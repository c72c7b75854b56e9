#!/usr/bin/env bash
# NaCl sweep (methods/nacl.md section 6.3 / 6.5): proxy fraction x random share at one budget,
# over several seeds, with `kvslim eval --json`; a table (mean +- sd of KL and top-1 over the
# seeds) and a gnuplot PNG of KL against random share, one line per proxy fraction, with
# StreamingLLM, H2O and SnapKV at the same budget as horizontal references.
#
# usage: scripts/nacl_sweep.sh [-b BIN] [-m MODEL] [-t TOKENS] [-p PROMPT_LEN] [-B BUDGET]
#                              [-s SEEDS] [-o OUT_DIR]
#   defaults: build-nacl/kvslim, ../shared stories260K-f32 and sample-512, prompt 384,
#   budget 0.25, seeds 10 (0..9), out build-nacl/nacl-sweep
# needs: jq, gnuplot
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
shared=${KVS_SHARED_DIR:-$root/../shared}
bin=$root/build-nacl/kvslim
model=$shared/models/gguf/stories260K-f32.gguf
toks=$shared/models/golden/stories260K-sample-512.tokens
plen=384
budget=0.25
seeds=10
out=$root/build-nacl/nacl-sweep
while getopts "b:m:t:p:B:s:o:" opt; do
    case $opt in
    b) bin=$OPTARG ;; m) model=$OPTARG ;; t) toks=$OPTARG ;; p) plen=$OPTARG ;;
    B) budget=$OPTARG ;; s) seeds=$OPTARG ;; o) out=$OPTARG ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
    esac
done
proxies=(0.01 0.05 0.1 0.25)
shares=(0 0.3 0.5 0.7)
mkdir -p "$out"

kv=()
for px in "${proxies[@]}"; do
    for rs in "${shares[@]}"; do
        kv+=(--kv "nacl:proxy=$px,random_share=$rs")
    done
done
for ((s = 0; s < seeds; s++)); do
    seeded=()
    for ((i = 1; i < ${#kv[@]}; i += 2)); do
        seeded+=(--kv "${kv[i]},seed=$s")
    done
    extra=()
    ((s == 0)) && extra=(--kv streaming --kv h2o --kv snapkv)
    "$bin" eval -m "$model" --tokens "$toks" --prompt-len "$plen" --budget "$budget" -t 2 \
        "${seeded[@]}" "${extra[@]}" --json "$out/seed$s.json" >/dev/null
done

# One row per (proxy, share): mean and sd (population of seeds, n-1) of KL and top-1.
jq -s -r --arg seeds "$seeds" '
  def param($p; $k; $d): ($p | capture("[:,]" + $k + "=(?<v>[^,]+)")? | .v | tonumber) // $d;
  def sd: (length) as $n | (add / $n) as $m
          | if $n > 1 then (map((. - $m) * (. - $m)) | add / ($n - 1) | sqrt) else 0 end;
  [ .[][] | select(.policy == "nacl")
    | {px: param(.params; "proxy"; 0.1), rs: param(.params; "random_share"; 0.7),
       kl, top1, recall: .attn_recall} ]
  | group_by([.px, .rs]) | .[]
  | [ .[0].px, .[0].rs, (map(.kl) | add / length), (map(.kl) | sd),
      (map(.top1) | add / length), (map(.top1) | sd), (map(.recall) | add / length),
      length ] | @tsv' "$out"/seed*.json > "$out/sweep.tsv"
jq -r '.[] | select(.policy == "streaming" or .policy == "h2o" or .policy == "snapkv")
       | [.policy, .kl, .top1] | @tsv' "$out/seed0.json" > "$out/baselines.tsv"

printf "NaCl sweep: prompt %s, budget %s, %s seeds (mean +- sd)\n\n" "$plen" "$budget" "$seeds"
printf "| proxy | random_share | KL | top-1 | attn recall |\n|---|---|---|---|---|\n"
awk -F'\t' '{printf "| %s | %s | %.4f ± %.4f | %.3f ± %.3f | %.4f |\n", $1, $2, $3, $4, $5, $6, $7}' \
    "$out/sweep.tsv"
printf "\nbaselines at the same budget: "
awk -F'\t' '{printf "%s KL %.4f top-1 %.3f; ", $1, $2, $3}' "$out/baselines.tsv"
printf "\n"

hline() { awk -F'\t' -v p="$1" '$1 == p {print $2}' "$out/baselines.tsv"; }
gnuplot <<EOF
set terminal pngcairo size 900,600 font "sans,11"
set output "$out/nacl_sweep.png"
set title "NaCl at budget $budget, prompt $plen: KL(full || nacl), mean ± sd over $seeds seeds"
set xlabel "random share (C_r / (C_p + C_r))"
set ylabel "mean KL (nats)"
set logscale y
set key outside right top
set grid
set xrange [-0.05:0.75]
set label 1 "nacl and snapkv append decoded tokens (B + t slots); streaming and h2o hold B" at graph 0.02, graph 0.04 font "sans,9"
plot for [px in "${proxies[*]}"] "< awk -F'\t' '\$1 == " . px . "' $out/sweep.tsv" \
       using 2:3:4 with yerrorlines lw 2 title "proxy ".px, \
     $(hline streaming) with lines dt 2 lc rgb "gray30" title "streaming", \
     $(hline h2o) with lines dt 3 lc rgb "black" title "h2o", \
     $(hline snapkv) with lines dt 4 lc rgb "brown" title "snapkv"
EOF
echo "plot: $out/nacl_sweep.png"
