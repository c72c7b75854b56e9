#!/usr/bin/env bash
# kvslim layersim on stories260K reproduces the independent measurement the issue quotes
# (prompt 384 of sample-512: K (2,3) ~0.09, V (2,3) ~-0.01, K (3,4) ~-0.44), writes JSON, and
# refuses bad input with clear messages.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
T=$GOLDEN/stories260K-sample-512.tokens
"$KVS_BIN" layersim -m "$M" --tokens "$T" --prompt-len 384 --json "$TMP/s.json" >"$TMP/table" \
  || fail "layersim exited non-zero"
sed '/norm ratio/,$d' "$TMP/table" >"$TMP/sim" # the similarity section
[ "$(grep -c '^(' "$TMP/sim")" -eq 4 ] && pass "4 adjacent pairs" || fail "$(cat "$TMP/table")"
# pair (2,3): K mean and V mean; pair (3,4): K mean
awk '$1 == "(2,3)" { k = $2; v = $6 } $1 == "(3,4)" { k34 = $2 }
     END { exit !(k > 0.085 && k < 0.095 && v > -0.015 && v < -0.005 && k34 > -0.445 && k34 < -0.435) }' \
  "$TMP/sim" && pass "stories260K: K(2,3) ~0.09, V(2,3) ~-0.01, K(3,4) ~-0.44" \
  || fail "similarities differ from the reference: $(cat "$TMP/table")"
[ "$(grep -c '"layer":' "$TMP/s.json")" -eq 4 ] && grep -q '"k_mean": 0.09' "$TMP/s.json" \
  && pass "JSON rows" || fail "JSON: $(head -c 400 "$TMP/s.json")"
# Norm ratios per pair: ordered percentiles, and not all 1 on a model whose layers differ.
python3 - "$TMP/s.json" <<'PY' && pass "norm ratio percentiles" || fail "norm ratios: $(head -c 600 "$TMP/s.json")"
import json, sys
rows = json.load(open(sys.argv[1]))
for r in rows:
    for k in "kv":
        a, b, c = (r[f"{k}_norm_ratio_p{p}"] for p in (10, 50, 90))
        assert 0 < a <= b <= c, r
assert any(abs(r["k_norm_ratio_p50"] - 1) > 0.1 for r in rows)
PY
grep -q 'norm ratio' "$TMP/table" && pass "table: norm ratio section" || fail "no norm ratio section"
expect_fail "missing --tokens" "needs -m MODEL and --tokens" "$KVS_BIN" layersim -m "$M"
expect_fail "prompt-len beyond the file" "exceeds the 512 tokens" \
  "$KVS_BIN" layersim -m "$M" --tokens "$T" --prompt-len 600
expect_fail "prompt-len 0" "prompt-len" "$KVS_BIN" layersim -m "$M" --tokens "$T" --prompt-len 0
finish
