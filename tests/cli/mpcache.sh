#!/usr/bin/env bash
# MPCache from the command line: a run prints its stats line and eval its report (keep, eta,
# selecting layers, the §3.5 counts); on the recall model at 10% with the static step alone
# (keep = budget) accuracy equals the share of needles kept; bad parameters fail with exit 2
# naming the parameter, on stories260K (5 layers) and the recall model (2 layers: the paper's
# skip=2 leaves no layer to share) alike.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
R=$MODELS/recall
RUN=("$KVS_BIN" run -m "$M" -p "Once upon a time" -n 48 --temp 0 -t 2)

"${RUN[@]}" --kv mpcache:budget=0.1 >"$TMP/run.txt" 2>"$TMP/run.err" \
  && pass "run" || fail "run: $(head -c 300 "$TMP/run.err")"
"$KVS_BIN" eval -m "$M" --tokens "$MODELS/golden/stories260K-sample-512.tokens" --prompt-len 384 \
  --kv mpcache --budget 0.1 --json "$TMP/e.json" >/dev/null 2>"$TMP/e.err" \
  && grep -q '"mpcache: keep 0.25 of the prompt, eta 0.4; 4 of 5 layers select' "$TMP/e.json" \
  && grep -q 'mpcache ops per decode step' "$TMP/e.json" \
  && pass "eval report" || fail "eval report: $(head -c 400 "$TMP/e.json") $(head -c 300 "$TMP/e.err")"

"$KVS_BIN" eval --task recall -m "$R/recall.bin" --tokenizer "$R/recall-tok.bin" \
  --prompts "$R/prompts/recall-1024" --kv mpcache:share=off,keep=0.1 --budget 0.1 --limit 20 -t 2 \
  --json "$TMP/r.json" >/dev/null 2>"$TMP/r.err" || fail "recall run: $(head -c 300 "$TMP/r.err")"
python3 - "$TMP/r.json" <<'PY' && pass "static step alone: accuracy = needles kept" || fail "recall: $(head -c 600 "$TMP/r.json")"
import json, sys
d = json.load(open(sys.argv[1])); r = (d["rows"] if isinstance(d, dict) else d)[0]
assert abs(r["accuracy"] - r["needle_kept_layers"][-1]) < 1e-9 and r["accuracy"] < 1, r
PY

expect_fail "s2 not dividing s1" "s2=12 does not divide s1=32" "${RUN[@]}" --kv mpcache:budget=0.1,s2=12
expect_fail "rho1=0" "rho1=0 must be in (0, 1\]" "${RUN[@]}" --kv mpcache:budget=0.1,rho1=0
expect_fail "keep=0" "keep=0 must be in (0, 1\]" "${RUN[@]}" --kv mpcache:budget=0.1,keep=0
expect_fail "keep=1.5" "keep=1.5 is out of range" "${RUN[@]}" --kv mpcache:budget=0.1,keep=1.5
expect_fail "window=0" "window=0 gives an observation window of zero tokens" \
  "${RUN[@]}" --kv mpcache:budget=0.1,window=0
expect_fail "skip past the layers" "share=on with skip=4: no layer of this 5-layer model" \
  "${RUN[@]}" --kv mpcache:budget=0.1,skip=4
expect_fail "sim=cosine" "sim=cosine is not one of linear|mean|maxdot|ub" \
  "${RUN[@]}" --kv mpcache:budget=0.1,sim=cosine
expect_fail "shift=on" "position shifting is only for evicting policies" \
  "${RUN[@]}" --kv mpcache:budget=0.1,shift=on
expect_fail "recall model, paper's skip" "share=on with skip=2: no layer of this 2-layer model" \
  "$KVS_BIN" eval --task recall -m "$R/recall.bin" --tokenizer "$R/recall-tok.bin" \
  --prompts "$R/prompts/recall-256" --kv mpcache --budget 0.1 --limit 1
finish
