#!/usr/bin/env bash
# kvslim eval --task opcount (the MPC op-count model, methods/mpcache.md §3.5): the Table 2
# comparison and one table per context on the recall model and on the synthetic 85.7M shape,
# JSON fields and a few exact counts (worked out in the comments), and bad usage: exit 2, a
# message naming the flag, nothing on stdout and no JSON written.
source "$(dirname "$0")/lib.bash"
R=$MODELS/recall
OC=("$KVS_BIN" eval --task opcount)
SHAPE=layers=12,heads=12,kv_heads=12,head_dim=64

if "${OC[@]}" -m "$R/recall.bin" --tokenizer "$R/recall-tok.bin" --ctx 1024,4096 \
  --json "$TMP/r.json" >"$TMP/r.txt" 2>"$TMP/err"
then pass "recall model runs"; else fail "recall model: $(head -c 400 "$TMP/err")"; fi
if "${OC[@]}" --shape "$SHAPE" --ctx 1024,2048,4096 --json "$TMP/s.json" >"$TMP/s.txt" 2>"$TMP/err"
then pass "--shape runs"; else fail "--shape: $(head -c 400 "$TMP/err")"; fi

# The table: Table 2's ratios, one header per context, eight method rows each.
grep -q "426.67x" "$TMP/r.txt" && grep -q "16.00x" "$TMP/r.txt" && grep -q "1.667x" "$TMP/r.txt" \
  && pass "Table 2 ratios printed" || fail "Table 2: $(head -n 8 "$TMP/r.txt")"
grep -q "73.5x latency and 369.8x communication" "$TMP/r.txt" && pass "paper's measured ratios" \
  || fail "paper's ratios missing"
[ "$(grep -c '^T [0-9]*, budget 0.05' "$TMP/s.txt")" = 3 ] && pass "three tables for --shape" \
  || fail "tables: $(grep -c '^T ' "$TMP/s.txt")"
for m in full token quest mp:static+token mp:+cluster mp:+linear mp:+hierarchy mp:+sharing; do
  [ "$(grep -c "^  $m " "$TMP/s.txt")" = 3 ] || fail "row $m not in every table"
done
pass "every method in every table"

# JSON: row CTX METHOD FIELD pulls one field (one object per line).
row() { grep "\"ctx\": $2, .*\"method\": \"$3\"" "$1" | grep -o "\"$4\": [^,}]*" | sed 's/.*: //'; }
expect() { # FILE CTX METHOD FIELD VALUE WHY
  local got; got=$(row "$1" "$2" "$3" "$4")
  [ "$got" = "$5" ] && pass "$3 at $2: $4 = $5 ($6)" || fail "$3 at $2: $4 '$got', want $5 ($6)"
}
missing=""
for f in task model shape mpcache table2 rows ctx budget tail method selector_layers attended \
  sim_mults sim_max sim_div topk_len topk_calls gather_eq gather_bits softmax_len attn_mults \
  red_softmax red_mults red_bits k1 k2 bits1 bits2 test_bits_ratio paper_latency_ratio; do
  grep -q "\"$f\": " "$TMP/s.json" || missing="$missing $f"
done
[ -z "$missing" ] && pass "JSON fields" || fail "JSON lacks:$missing"
[ "$(grep -c '"method": ' "$TMP/s.json")" = 24 ] && pass "24 JSON rows (3 contexts x 8)" \
  || fail "JSON rows: $(grep -c '"method": ' "$TMP/s.json")"
if command -v python3 >/dev/null; then
  python3 -m json.tool "$TMP/s.json" >/dev/null && pass "JSON parses" || fail "JSON does not parse"
fi
grep -q '"test_bits_ratio": 426.66' "$TMP/s.json" && pass "JSON table2 426.67x" \
  || fail "JSON table2 ratio"

# The 85.7M shape (12 layers, 12 heads = 12 KV heads, d 64), T 1024, F 0.05:
# full k = 1024 + 1 = 1025, softmax 144 x 1025 = 147600, qK/PV 2 x 1025 x 64 x 144 = 18892800.
expect "$TMP/s.json" 1024 full softmax_len 147600 "144 heads x 1025"
expect "$TMP/s.json" 1024 full attn_mults 18892800 "2 x 1025 x 64 x 144"
expect "$TMP/s.json" 1024 full red_mults 1 "full against itself"
# token: ceil(51.2) = 52 chosen; gather 52 x 1024 tests x 144 heads = 7667712, on 10 bits.
expect "$TMP/s.json" 1024 token gather_eq 7667712 "52 x 1024 x 144"
expect "$TMP/s.json" 1024 token gather_bits 76677120 "x 10 bits"
# mp:+linear: 16 fine clusters x 64 mults x 144 = 147456; UB twice that, with 16 x 64 x 144 max.
expect "$TMP/s.json" 1024 mp:+linear sim_mults 147456 "16 x 64 x 144"
expect "$TMP/s.json" 1024 mp:+linear sim_max 0 "linear has no max"
expect "$TMP/s.json" 1024 mp:+cluster sim_mults 294912 "2 x 16 x 64 x 144"
expect "$TMP/s.json" 1024 mp:+cluster sim_max 147456 "16 x 64 x 144"
# sharing: layers 0, 1, 2, 4, 6, 8, 10 select; each attends 4 x 16 + 1 = 65 tokens.
expect "$TMP/s.json" 1024 mp:+sharing selector_layers 7 "2 + 10 / 2"
expect "$TMP/s.json" 4096 mp:+sharing attended 209 "n2 = ceil(0.2 x 64) = 13: 13 x 16 + 1"
# The recall model (2 layers, 2 heads, 1 KV head, d 64) at 4096: full softmax 4 x 4097.
expect "$TMP/r.json" 4096 full softmax_len 16388 "4 query heads x 4097"
expect "$TMP/r.json" 4096 token sim_mults 524288 "4096 x 64 x 2 layers x 1 KV head"
grep -q '"model": "recall.bin"' "$TMP/r.json" && grep -q '"kv_heads": 1' "$TMP/r.json" \
  && pass "recall shape from the checkpoint" || fail "recall shape: $(head -n 3 "$TMP/r.json")"

# --budget and --kv mpcache: 10% with share=off: +sharing equals +hierarchy.
if "${OC[@]}" --shape "$SHAPE" --ctx 1024 --budget 10% --kv mpcache:share=off \
  --json "$TMP/k.json" >/dev/null 2>"$TMP/err"; then
  a=$(row "$TMP/k.json" 1024 mp:+sharing sim_mults); b=$(row "$TMP/k.json" 1024 mp:+hierarchy sim_mults)
  [ -n "$a" ] && [ "$a" = "$b" ] && pass "share=off: +sharing = +hierarchy ($a)" \
    || fail "share=off: '$a' vs '$b'"
  grep -q '"budget": 0.1,' "$TMP/k.json" && pass "--budget 10%" || fail "--budget 10% not in JSON"
else
  fail "--kv mpcache:share=off: $(head -c 400 "$TMP/err")"
fi

# expect_usage DESCRIPTION PATTERN ARGS...: exit 2, PATTERN on stderr, no stdout, no JSON.
expect_usage() {
  local what=$1 pattern=$2; shift 2
  local status=0
  rm -f "$TMP/bad.json"
  "${OC[@]}" "$@" --json "$TMP/bad.json" >"$TMP/out" 2>"$TMP/err" || status=$?
  if [ "$status" != 2 ]; then
    fail "$what: exit $status, not 2: $(head -c 400 "$TMP/err")"
  elif ! grep -q -- "$pattern" "$TMP/err"; then
    fail "$what: stderr lacks '$pattern': $(head -c 400 "$TMP/err")"
  elif [ -e "$TMP/bad.json" ] || [ -s "$TMP/out" ]; then
    fail "$what: wrote output"
  else
    pass "$what: $(head -n 1 "$TMP/err")"
  fi
}
expect_usage "--ctx 0" "--ctx 0" --shape "$SHAPE" --ctx 0
expect_usage "--ctx junk" "--ctx x" --shape "$SHAPE" --ctx 1024,x
expect_usage "no --ctx" "--ctx" --shape "$SHAPE"
expect_usage "--shape layers=0" "--shape layers=0" --shape layers=0,heads=1,kv_heads=1,head_dim=8 --ctx 8
expect_usage "heads not a multiple of kv_heads" "kv_heads=2" --shape layers=1,heads=3,kv_heads=2,head_dim=8 --ctx 8
expect_usage "--shape missing a key" "--shape" --shape layers=1,heads=2 --ctx 8
expect_usage "--shape unknown key" "--shape dim=8" --shape layers=1,heads=1,kv_heads=1,dim=8 --ctx 8
expect_usage "neither -m nor --shape" "-m MODEL or --shape" --ctx 8
expect_usage "-m and --shape" "not both" -m "$R/recall.bin" --shape "$SHAPE" --ctx 8
expect_usage "llama2.c without --tokenizer" "--tokenizer" -m "$R/recall.bin" --ctx 8
expect_usage "--budget 0" "--budget 0" --shape "$SHAPE" --ctx 8 --budget 0
expect_usage "--budget 1.5" "--budget 1.5" --shape "$SHAPE" --ctx 8 --budget 1.5
expect_usage "--kv not mpcache" "--kv h2o" --shape "$SHAPE" --ctx 8 --kv h2o:budget=0.1
expect_usage "--kv unknown policy" "--kv" --shape "$SHAPE" --ctx 8 --kv nosuch
expect_usage "--kv bad mpcache" "s2=5" --shape "$SHAPE" --ctx 8 --kv mpcache:s2=5
"${OC[@]}" --help >"$TMP/help" 2>&1; grep -q "sm_x" "$TMP/help" && pass "--help explains the columns" || fail "--help"
finish
