#!/usr/bin/env bash
# MiniCache (--kv minicache[:...]) through eval, run and bench: the reference numbers of
# fidelity-methods-2.md on the sample, the policy's report (pairs, retained counts, bytes
# against the spec's and the paper's formulas), and bad input failing with no output.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
T=$GOLDEN/stories260K-sample-512.tokens

# The reference (an independent implementation): KL 0.9426, top-1 0.520 on F32.
"$KVS_BIN" eval -m "$M" --tokens "$T" --prompt-len 384 --kv minicache >"$TMP/out" 2>"$TMP/err" \
  && grep -q '^| minicache | f32 | - | .* | 0\.9426 | 0\.520 | 9\.688 |' "$TMP/out" \
  && pass "eval minicache: $(grep '^| minicache' "$TMP/out")" \
  || fail "eval minicache: $(head -c 600 "$TMP/out") $(head -c 300 "$TMP/err")"
# A policy that takes no budget runs once per storage type beside budgeted ones (it failed
# with "takes no budget" when --budget was crossed with every spec).
"$KVS_BIN" eval -m "$M" --tokens "$T" --prompt-len 384 --kv minicache,streaming --budget 0.1,0.25 \
  --kv-type f32,kivi4 >"$TMP/mix" 2>"$TMP/err" \
  && [ "$(grep -c '^| minicache |' "$TMP/mix")" = 2 ] && [ "$(grep -c '^| streaming |' "$TMP/mix")" = 4 ] \
  && pass "eval: minicache once per type beside budgets" \
  || fail "eval minicache with --budget: $(head -c 300 "$TMP/err") $(cat "$TMP/mix")"

# Ablations run: Mean merge, t, gamma, merged layers, per-head units, KIVI-4.
for spec in minicache:merge=mean minicache:t=0.5 minicache:gamma=0 minicache:layers=4 \
    minicache:retain=topfrac,unit=head minicache:decode_retain=frozen; do
  "$KVS_BIN" eval -m "$M" --tokens "$T" --prompt-len 384 --kv "$spec" --kv-type kivi4 \
    >"$TMP/out" 2>"$TMP/err" && grep -q "^| $spec |" "$TMP/out" \
    && pass "eval $spec on kivi4" || fail "$spec: $(head -c 300 "$TMP/err")"
done

# bench prints the policy's report.
"$KVS_BIN" bench -m "$M" -p 384 -n 16 -t 1 --kv minicache --kv-type kivi4 >"$TMP/out" 2>&1 \
  && grep -q '^pairs (2,3); retained 2-3:K [0-9]*, 2-3:V [0-9]*$' "$TMP/out" \
  && grep -q 'measured 0\.[0-9]*, spec formula (3.2) 0\.[0-9]*, paper formula (3.1) 0\.7906' "$TMP/out" \
  && pass "bench report: $(grep -m1 '^pairs' "$TMP/out")" || fail "bench: $(head -c 600 "$TMP/out")"

# A merged-layer run generates text.
"$KVS_BIN" run -m "$M" -p "Once upon a time" -n 60 --temp 0 --kv minicache:start=0 \
  >"$TMP/out" 2>"$TMP/err" && [ -s "$TMP/out" ] && pass "run minicache:start=0" \
  || fail "run: $(head -c 300 "$TMP/err")"

# Bad input: named parameter and range, and nothing on stdout.
no_output() { # DESC PATTERN CMD...
  local what=$1; expect_fail "$@"
  [ -s "$TMP/out" ] && fail "$what: wrote to stdout: $(head -c 200 "$TMP/out")" || true
}
no_output "start beyond the layers" "start=5 is beyond the last layer (start in \[0, 4\] for a model of 5 layers" \
  "$KVS_BIN" run -m "$M" -p "Once upon a time" -n 8 --kv minicache:start=5
no_output "layers beyond the model" "layers=6 exceeds the model's 5 layers (layers in \[0, 5\])" \
  "$KVS_BIN" eval -m "$M" --tokens "$T" --prompt-len 384 --kv minicache:layers=6
no_output "start and layers" "give start (the first merged layer) or layers" \
  "$KVS_BIN" run -m "$M" -p "Once" -n 8 --kv minicache:start=2,layers=2
no_output "t out of range" "t=1.5 is out of range (a decimal number in \[0, 1\])" \
  "$KVS_BIN" run -m "$M" -p "Once" -n 8 --kv minicache:t=1.5
no_output "gamma out of range" "gamma=2 is out of range (a decimal number in \[0, 1\])" \
  "$KVS_BIN" run -m "$M" -p "Once" -n 8 --kv minicache:gamma=2
no_output "a budget" "minicache takes no budget" \
  "$KVS_BIN" run -m "$M" -p "Once" -n 8 --kv minicache:budget=0.5
no_output "a merge word" "merge=avg is not one of slerp|mean|fmax" \
  "$KVS_BIN" run -m "$M" -p "Once" -n 8 --kv minicache:merge=avg
no_output "one layer" "minicache merges pairs of adjacent layers; this model has 1 layer" \
  "$KVS_BIN" bench --synthetic dim=64,hidden=128,layers=1,heads=2,kv_heads=2,vocab=512 \
  -p 16 -n 4 -t 1 --kv minicache
finish
