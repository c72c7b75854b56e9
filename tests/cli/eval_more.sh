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
finish
