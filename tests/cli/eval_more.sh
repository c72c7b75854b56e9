#!/usr/bin/env bash
# kvslim eval beyond the reference protocol: several budgets with --equal-memory (the rows array
# grows), budget spellings, progress lines on a non-terminal stderr, results written as rows
# complete, and messages in the user's terms.
source "$(dirname "$0")/lib.bash"
GGUF=$MODELS/gguf/stories260K-f32.gguf
TOKENS=$GOLDEN/stories260K-sample-512.tokens

# Defect 1: with --equal-memory, each budget's equal-memory rows (here one per evicting policy)
# were appended without the plain rows of the next budget getting room: four budgets of one
# one-shot policy wrote past the rows array.
if "$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS" --prompt-len 384 \
  --kv snapkv --budget 0.1,0.2,0.3,0.4 --equal-memory -t 2 \
  --json "$TMP/eq.json" >"$TMP/eq.table" 2>"$TMP/eq.err"
then pass "equal memory at four budgets"
else fail "equal memory at four budgets: $(grep -m 3 -E 'ERROR|SUMMARY|kvslim|free' "$TMP/eq.err")"; fi
n_eq=$(grep -c '| eq:' "$TMP/eq.table" || true)
[ "$n_eq" -ge 16 ] && pass "equal-memory rows: $n_eq" || fail "equal-memory rows: $n_eq"

B=("$KVS_BIN" eval -m "$GGUF" --tokens "$TOKENS" --prompt-len 384 -t 2)

# Budget spellings: a fraction (0.25 or 25%) or a slot count (slots=N); a bare whole number is
# ambiguous and refused with both spellings shown.
expect_fail "bare whole-number budget" "write 96% .* or slots=96" "${B[@]}" --kv streaming --budget 96
expect_fail "bad budget word" "expected a fraction of the prompt (0.25 or 25%) or a slot count" \
  "${B[@]}" --kv streaming --budget half

"${B[@]}" --kv streaming --budget 0.25,25%,slots=96 --json "$TMP/sp.json" >"$TMP/sp.table" 2>/dev/null \
  && grep -q '^| streaming | f32 | 0.25 | 96 |' "$TMP/sp.table" && grep -q '^| streaming | f32 | 25% | 96 |' "$TMP/sp.table" \
  && grep -q '^| streaming | f32 | 96 | 96 |' "$TMP/sp.table" && grep -q '"params": "streaming:slots=96"' "$TMP/sp.json" \
  && pass "budget spellings 0.25, 25%, slots=96" || fail "budget spellings: $(cat "$TMP/sp.table")"

# Too few tokens for any eval: said in the file's terms, not "the prompt must be 1..0".
printf '1\n' >"$TMP/one.tokens"
expect_fail "one-token file" "one.tokens has 1 token; eval needs at least 3" \
  "$KVS_BIN" eval -m "$GGUF" --tokens "$TMP/one.tokens" --prompt-len 1 --kv full
printf '1\n403\n' >"$TMP/two.tokens"
expect_fail "two-token file" "two.tokens has 2 tokens; eval needs at least 3" \
  "$KVS_BIN" eval -m "$GGUF" --tokens "$TMP/two.tokens" --prompt-len 1 --kv full
grep -q "1\.\.0" "$TMP/err" && fail "prompt range 1..0 still printed" || pass "no 1..0 range"

# A spec the model or prompt refuses fails before the first run: exit 2, nothing on stdout, no
# result file.
status=0
"${B[@]}" --kv full --kv "h2o:budget=0.1" --kv "streaming:slots=100,sinks=400" \
  --json "$TMP/early.json" >"$TMP/out" 2>"$TMP/err" || status=$?
[ "$status" = 2 ] && [ ! -s "$TMP/out" ] && [ ! -e "$TMP/early.json" ] && grep -q "no room" "$TMP/err" \
  && ! grep -q 'done in' "$TMP/err" && pass "spec checked before any run: $(head -n 1 "$TMP/err")" \
  || fail "late spec failure: exit $status, $(head -c 300 "$TMP/err")"

# Progress: one line per finished run on a non-terminal stderr; results rewritten after every
# run, so stopping an eval keeps the rows it finished.
"${B[@]}" --kv streaming,h2o,tova --budget 0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8 \
  --json "$TMP/part.json" --csv "$TMP/part.csv" >/dev/null 2>"$TMP/progress" &
pid=$!
for _ in $(seq 1 600); do
  [ -e "$TMP/part.json" ] && [ "$(grep -c '"policy"' "$TMP/part.json")" -ge 3 ] && break
  sleep 0.05
done
kill -TERM "$pid" 2>/dev/null || true # (a background job of a script ignores SIGINT)
wait "$pid" 2>/dev/null || true
rows=$(grep -c '"policy"' "$TMP/part.json" 2>/dev/null || echo 0)
[ "$rows" -ge 3 ] && [ "$rows" -lt 25 ] && pass "interrupted eval kept $rows of 25 rows" \
  || fail "interrupted eval kept $rows of 25 rows"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$TMP/part.json" \
    && pass "kept JSON parses" || fail "kept JSON does not parse"
fi
[ "$(($(wc -l <"$TMP/part.csv") - 1))" -ge "$((rows - 1))" ] && pass "kept CSV rows" || fail "kept CSV"
grep -q '^eval \[1/25\] full done in [0-9.]* s$' "$TMP/progress" \
  && grep -q '^eval \[2/25\] streaming:budget=0.1 done in' "$TMP/progress" \
  && ! grep -q $'\r' "$TMP/progress" && pass "progress lines: $(sed -n 2p "$TMP/progress")" \
  || fail "progress: $(head -c 300 "$TMP/progress")"
finish
