#!/usr/bin/env bash
# convert --duplicate-layers: SOLAR-style depth up-scaling of stories260K (5 layers -> 8,
# layers 0,1,1,2,2,3,3,4). The model loads, its duplicated pairs are far more similar than the
# original's adjacent layers, and bad lists are refused naming the flag.
source "$(dirname "$0")/lib.bash"
B=$MODELS/stories260K.bin
K=$MODELS/tok512.bin
T=$GOLDEN/stories260K-sample-512.tokens
"$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers 1,2,3 -o "$TMP/up.gguf" 2>/dev/null \
  && pass "convert --duplicate-layers 1,2,3" || fail "convert --duplicate-layers failed"
"$KVS_BIN" layersim -m "$TMP/up.gguf" --tokens "$T" --prompt-len 384 >"$TMP/table" \
  || fail "layersim on the upscaled model"
sed -i '/norm ratio/,$d' "$TMP/table" # the similarity section
[ "$(grep -c '^(' "$TMP/table")" -eq 7 ] && pass "8 layers, 7 pairs" || fail "$(cat "$TMP/table")"
# duplicated pairs (1,2), (3,4), (5,6): K mean > 0.98, V mean > 0.8 (not 1: the copy reads the
# residual stream after the first one has added to it)
awk '$1 == "(1,2)" || $1 == "(3,4)" || $1 == "(5,6)" { n++; if ($2 < 0.98 || $6 < 0.8) bad = 1 }
     END { exit !(n == 3 && !bad) }' "$TMP/table" \
  && pass "duplicated pairs similar (K > 0.98, V > 0.8)" || fail "$(cat "$TMP/table")"
"$KVS_BIN" logits -m "$TMP/up.gguf" --tokens "$T" --out "$TMP/l.f32" 2>/dev/null \
  && pass "upscaled model runs" || fail "logits on the upscaled model"
# MiniCache where its premise holds: with layers 2,3,4 duplicated its default pairs (4,5), (6,7)
# are copies, and merging them costs far less than merging stories260K's dissimilar pair (2,3)
# (KL 0.94 there, the independent reference's 0.9426).
"$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers 2,3,4 -o "$TMP/up234.gguf" 2>/dev/null \
  || fail "convert --duplicate-layers 2,3,4"
kl_of() { "$KVS_BIN" eval -m "$1" --tokens "$T" --prompt-len 384 --kv "$2" --json "$TMP/mc.json" \
  >/dev/null 2>&1 && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r=r["rows"] if isinstance(r,dict) else r; print([x for x in r if x["policy"]!="full"][0]["kl"])' "$TMP/mc.json"; }
up=$(kl_of "$TMP/up234.gguf" minicache); orig=$(kl_of "$MODELS/gguf/stories260K-f32.gguf" minicache)
awk -v u="$up" -v o="$orig" 'BEGIN { exit !(u != "" && o != "" && u < 0.05 && o > 0.5) }' \
  && pass "minicache: KL $up on the up-scaled model, $orig on stories260K" \
  || fail "minicache KL up-scaled '$up' vs original '$orig'"
expect_fail "layer out of range" "--duplicate-layers: layer 5 (entry 1 of the list) is outside the model's layers 0..4" \
  "$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers 5 -o "$TMP/x.gguf"
expect_fail "listed twice" "--duplicate-layers: layer 2 is listed twice" \
  "$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers 1,2,2 -o "$TMP/x.gguf"
expect_fail "decreasing" "--duplicate-layers: layer 1 comes after a later one" \
  "$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers 3,1 -o "$TMP/x.gguf"
expect_fail "not a number" "--duplicate-layers: 'x' is not a layer index" \
  "$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers 1,x -o "$TMP/x.gguf"
expect_fail "negative" "--duplicate-layers: '-1' is not a layer index" \
  "$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers -1 -o "$TMP/x.gguf"
expect_fail "empty item" "empty item" \
  "$KVS_BIN" convert "$B" --tokenizer "$K" --duplicate-layers 1,,2 -o "$TMP/x.gguf"
[ ! -e "$TMP/x.gguf" ] && pass "no partial output" || fail "x.gguf written"
finish
