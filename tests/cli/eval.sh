#!/usr/bin/env bash
# kvslim eval on the reference protocol (stories260K, sample-512, prompt 384): the full row is
# exact, streaming matches the reference's numbers, JSON/CSV carry the documented fields, and
# bad input fails cleanly without leaving files.
source "$(dirname "$0")/lib.bash"
GGUF=$MODELS/gguf/stories260K-f32.gguf
TOKENS=$GOLDEN/stories260K-sample-512.tokens
FIELDS="policy params kv_type budget kl top1 ppl ppl_full attn_recall slots_attended_mean kv_bytes kv_bytes_mean kv_bytes_end kv_bytes_full_f16 kv_bytes_rel_f16 report"

if "$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS" --prompt-len 384 --kv full,streaming \
  --budget 0.1,1.0 -t 2 --json "$TMP/out.json" --csv "$TMP/out.csv" >"$TMP/table" 2>"$TMP/err"
then pass "eval runs"; else fail "eval runs: $(head -c 400 "$TMP/err")"; fi
# Not a terminal: no spinner, just one line per finished run.
! grep -qv '^eval \[[0-9]*/3\] .* done in ' "$TMP/err" && [ "$(wc -l <"$TMP/err")" = 3 ] \
  && pass "stderr: one line per run when not a terminal" || fail "stderr: $(head -c 200 "$TMP/err")"
grep -q '^| full | f32 | - | 384 | 448.5 | 0.0000 | 1.000 |' "$TMP/table" && pass "table full row" \
  || fail "table full row: $(cat "$TMP/table")"

# Pulls a field of the JSON row with the given params (the objects are one per line).
field() { grep "\"params\": \"$1\"" "$TMP/out.json" | grep -o "\"$2\": [^,}]*" | sed 's/.*: //'; }
[ "$(field full kl)" = 0 ] && [ "$(field full top1)" = 1 ] && pass "full: kl 0, top1 1" \
  || fail "full: kl $(field full kl) top1 $(field full top1)"
[ "$(field full ppl)" = "$(field full ppl_full)" ] && pass "full: ppl = ppl_full" || fail "full ppl"
kl=$(field streaming:budget=0.1 kl)
awk -v k="$kl" 'BEGIN { exit !(k > 0) }' && pass "streaming 0.1: kl $kl > 0" || fail "streaming kl '$kl'"
# The independent reference measured streaming at 0.1: KL 0.0650, top-1 0.874, recall 0.8227.
awk -v k="$kl" -v t="$(field streaming:budget=0.1 top1)" -v r="$(field streaming:budget=0.1 attn_recall)" \
  'BEGIN { exit !(k > 0.0617 && k < 0.0683 && t > 0.86 && t < 0.89 && r > 0.81 && r < 0.835) }' \
  && pass "streaming 0.1 near the reference" || fail "streaming 0.1: kl $kl"
[ "$(field streaming:budget=0.1 slots_attended_mean)" = 38 ] && pass "streaming 0.1 attends 38" \
  || fail "streaming 0.1 attends $(field streaming:budget=0.1 slots_attended_mean)"
# budget 1.0 is the whole prompt (384 slots), not one token.
[ "$(field streaming:budget=1.0 slots_kept)" = 384 ] && pass "budget 1.0 keeps 384" \
  || fail "budget 1.0 keeps $(field streaming:budget=1.0 slots_kept)"
[ "$(grep -c '"policy"' "$TMP/out.json")" = 3 ] && pass "three JSON rows" || fail "JSON rows"

missing=""
for f in $FIELDS; do
  grep -q "\"$f\": " "$TMP/out.json" || missing="$missing $f"
done
[ -z "$missing" ] && pass "JSON has every field" || fail "JSON lacks$missing"
header=$(head -n 1 "$TMP/out.csv")
case "$header" in
  "policy,params,budget,kl,top1,ppl,ppl_full,attn_recall,slots_attended_mean,kv_bytes,kv_bytes_mean,kv_bytes_full_f16"*)
    pass "CSV header" ;;
  *) fail "CSV header: $header" ;;
esac
[ "$(wc -l <"$TMP/out.csv")" = 4 ] && pass "CSV rows" || fail "CSV rows: $(wc -l <"$TMP/out.csv")"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert len(r)==3' "$TMP/out.json" \
    && pass "JSON parses" || fail "JSON does not parse"
fi

# A full-only run still works, and a policy's own budget is used without --budget.
"$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS" --prompt-len 500 --kv full \
  --kv streaming:slots=64 -t 2 >"$TMP/t2" 2>&1 \
  && grep -q '^| streaming | f32 | 64 | 64 | 64.0 |' "$TMP/t2" && pass "own budget" \
  || fail "own budget: $(head -c 400 "$TMP/t2")"

# Equal memory: streaming at the one-shot policy's mean slots attended (snapkv at 0.1 attends
# 38 + 64.5 = 102.5 on average, so streaming runs with 103).
if "$KVS_BIN" eval --kv help | grep '^snapkv ' >/dev/null; then
  "$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS" --prompt-len 384 --kv streaming,snapkv \
    --budget 0.1 --equal-memory -t 2 --csv "$TMP/eq.csv" >"$TMP/t3" 2>&1 \
    && grep -q '^| streaming | f32 | eq:103 | 103 | 103.0 |' "$TMP/t3" \
    && grep -q '"eq:103","evicting","snapkv:budget=0.1"' "$TMP/eq.csv" \
    && pass "equal memory" || fail "equal memory: $(head -c 600 "$TMP/t3")"
fi

if command -v gnuplot >/dev/null; then
  "$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS" --prompt-len 448 --kv full,streaming \
    --budget 0.25,0.5 -t 2 --plot "$TMP/plot.png" >/dev/null 2>"$TMP/err" \
    && [ "$(head -c 4 "$TMP/plot.png" | od -An -c | tr -d ' ')" = '211PNG' ] \
    && pass "plot is a PNG" || fail "plot: $(head -c 400 "$TMP/err")"
fi
# Without gnuplot on PATH, --plot fails before any run.
expect_fail "plot without gnuplot" "gnuplot was not found" \
  env PATH=/nonexistent "$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS" --prompt-len 384 \
  --kv full --plot "$TMP/noplot.png"

B=("$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS")
expect_fail "bad flag" "unknown option '--bogus'" "${B[@]}" --prompt-len 384 --kv full --bogus
expect_fail "no --kv" "at least one --kv" "${B[@]}" --prompt-len 384
expect_fail "prompt too long" "--prompt-len 511 is out of range" "${B[@]}" --prompt-len 511 --kv full
expect_fail "prompt zero" "--prompt-len expects a whole number" "${B[@]}" --prompt-len 0 --kv full
expect_fail "unknown policy" "unknown policy 'nope'" "${B[@]}" --prompt-len 384 --kv nope
expect_fail "no budget" "needs budget=" "${B[@]}" --prompt-len 384 --kv streaming
expect_fail "bad budget" "must be a decimal number in (0, 1]" "${B[@]}" --prompt-len 384 --kv streaming --budget 1.5
expect_fail "empty budget item" "empty item" "${B[@]}" --prompt-len 384 --kv streaming --budget 0.1,,0.2
expect_fail "bad kv-type" "unknown type 'q9'" "${B[@]}" --prompt-len 384 --kv full --kv-type q9
expect_fail "missing tokens" "$TMP/nope.tokens" "$KVS_BIN" eval -m "$GGUF" --tokens "$TMP/nope.tokens" \
  --prompt-len 4 --kv full
printf '1\n403\n512\n7\n9\n' >"$TMP/oov.tokens"
expect_fail "out-of-vocabulary id" "outside the vocabulary" "$KVS_BIN" eval -m "$GGUF" \
  --tokens "$TMP/oov.tokens" --prompt-len 2 --kv full --json "$TMP/bad.json"
# (A fraction that small, --budget 0.01, is raised to the policy's minimum with a notice; an
# explicit slot count is not.)
expect_fail "policy fails at run time" "leaves no room" "${B[@]}" --prompt-len 384 \
  --kv full --kv streaming:slots=4 --json "$TMP/bad.json" --csv "$TMP/bad.csv"
expect_fail "unwritable output" "not writable" "${B[@]}" --prompt-len 384 --kv full \
  --json "$TMP/no/such/dir/x.json"
[ ! -e "$TMP/bad.json" ] && [ ! -e "$TMP/bad.csv" ] && ! ls "$TMP"/bad.* >/dev/null 2>&1 \
  && pass "nothing written on failure" || fail "output written on failure: $(ls "$TMP")"
"$KVS_BIN" eval --help | grep "usage: kvslim eval" >/dev/null && pass "eval --help" || fail "eval --help"
finish
