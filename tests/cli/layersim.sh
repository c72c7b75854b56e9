#!/usr/bin/env bash
# kvslim layersim on stories260K reproduces the independent measurement the issue quotes
# (prompt 384 of sample-512: K (2,3) ~0.09, V (2,3) ~-0.01, K (3,4) ~-0.44), writes JSON, and
# refuses bad input with clear messages.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
T=$GOLDEN/stories260K-sample-512.tokens
"$KVS_BIN" layersim -m "$M" --tokens "$T" --prompt-len 384 --json "$TMP/s.json" >"$TMP/table" \
  || fail "layersim exited non-zero"
[ "$(grep -c '^(' "$TMP/table")" -eq 4 ] && pass "4 adjacent pairs" || fail "$(cat "$TMP/table")"
# pair (2,3): K mean and V mean; pair (3,4): K mean
awk '$1 == "(2,3)" { k = $2; v = $6 } $1 == "(3,4)" { k34 = $2 }
     END { exit !(k > 0.085 && k < 0.095 && v > -0.015 && v < -0.005 && k34 > -0.445 && k34 < -0.435) }' \
  "$TMP/table" && pass "stories260K: K(2,3) ~0.09, V(2,3) ~-0.01, K(3,4) ~-0.44" \
  || fail "similarities differ from the reference: $(cat "$TMP/table")"
[ "$(grep -c '"layer":' "$TMP/s.json")" -eq 4 ] && grep -q '"k_mean": 0.09' "$TMP/s.json" \
  && pass "JSON rows" || fail "JSON: $(head -c 400 "$TMP/s.json")"
expect_fail "missing --tokens" "needs -m MODEL and --tokens" "$KVS_BIN" layersim -m "$M"
expect_fail "prompt-len beyond the file" "exceeds the 512 tokens" \
  "$KVS_BIN" layersim -m "$M" --tokens "$T" --prompt-len 600
expect_fail "prompt-len 0" "prompt-len" "$KVS_BIN" layersim -m "$M" --tokens "$T" --prompt-len 0
finish
