#!/usr/bin/env bash
# PQCache from the command line: a run with the slow tier in a file prints what the memory tier
# prints and leaves no file behind; retrieval on the recall model keeps the needle at 5% of the
# context; bad parameters and tier paths fail with exit 2 (or 1 for a failed write) naming the
# parameter, leaving an existing file untouched and no tier file behind, also when the tier
# fills up.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
RUN=("$KVS_BIN" run -m "$M" -p "Once upon a time" -n 48 --temp 0 -t 2)

"${RUN[@]}" --kv pqcache:budget=0.25 >"$TMP/mem.txt" 2>"$TMP/mem.err" \
  && pass "memory tier runs" || fail "memory tier: $(head -c 300 "$TMP/mem.err")"
grep -q "below the" "$TMP/mem.err" && fail "a fraction is raised: $(head -c 200 "$TMP/mem.err")" \
  || pass "a fraction sizes the window and top-k, no minimum notice"
mkdir "$TMP/tiers"
"${RUN[@]}" --kv "pqcache:budget=0.25,tier=$TMP/tiers/t.bin" >"$TMP/file.txt" 2>"$TMP/file.err" \
  && pass "file tier runs" || fail "file tier: $(head -c 300 "$TMP/file.err")"
cmp -s "$TMP/mem.txt" "$TMP/file.txt" && pass "file tier prints what the memory tier prints" \
  || fail "file tier output differs: $(head -c 200 "$TMP/file.txt")"
[ -z "$(ls -A "$TMP/tiers")" ] && pass "no tier file left behind" \
  || fail "left behind: $(ls -A "$TMP/tiers")"

# Bad input: exit 2 naming the parameter.
expect_fail "m not dividing head_dim" "m=3 does not divide the head dimension 8" \
  "${RUN[@]}" --kv pqcache:budget=0.25,m=3
expect_fail "bits=9" "bits=9 is out of range (a whole number in \[1, 8\])" "${RUN[@]}" --kv pqcache:budget=0.25,bits=9
expect_fail "bits=0" "bits=0 is out of range (a whole number in \[1, 8\])" "${RUN[@]}" --kv pqcache:budget=0.25,bits=0
expect_fail "k beyond the context" "k=5000 exceeds the context of 512" \
  "${RUN[@]}" --kv pqcache:budget=0.25,k=5000
expect_fail "tier is a directory" "tier=$TMP/tiers" "${RUN[@]}" --kv "pqcache:budget=0.25,tier=$TMP/tiers"
expect_fail "tier under a missing directory" "tier=$TMP/nope/t.bin" \
  "${RUN[@]}" --kv "pqcache:budget=0.25,tier=$TMP/nope/t.bin"
echo keep >"$TMP/tiers/existing"
expect_fail "tier path exists" "tier=$TMP/tiers/existing" \
  "${RUN[@]}" --kv "pqcache:budget=0.25,tier=$TMP/tiers/existing"
[ "$(cat "$TMP/tiers/existing")" = keep ] && pass "an existing file is left as it was" \
  || fail "the existing file changed"
rm "$TMP/tiers/existing"
expect_fail "pqcache on KIVI storage" "KIVI storage" "${RUN[@]}" --kv pqcache:budget=0.25 --kv-type kivi4

# An unwritable place (sysfs refuses new files, root included): exit 1 naming the tier.
if ! touch /sys/kvs-probe 2>/dev/null; then
  status=0
  "${RUN[@]}" --kv pqcache:budget=0.25,tier=/sys/kvs-tier.bin >"$TMP/out" 2>"$TMP/err" || status=$?
  [ "$status" = 1 ] && grep -q "tier=/sys/kvs-tier.bin" "$TMP/err" \
    && pass "unwritable tier: $(head -n 1 "$TMP/err")" \
    || fail "unwritable tier: exit $status: $(head -c 300 "$TMP/err")"
fi

# A full tier: the file size limit (SIGXFSZ ignored, so the write fails with EFBIG) stops the
# tier at 16 KiB; the run fails with status 1 naming the tier, and the file is gone.
status=0
(trap '' XFSZ; ulimit -f 16; exec "${RUN[@]}" --kv "pqcache:budget=0.25,tier=$TMP/tiers/full.bin") \
  >"$TMP/out" 2>"$TMP/err" || status=$?
if [ "$status" = 1 ] && grep -q "tier=$TMP/tiers/full.bin" "$TMP/err"; then
  pass "full tier: $(head -n 1 "$TMP/err")"
else
  fail "full tier: exit $status: $(head -c 300 "$TMP/err")"
fi
[ -z "$(ls -A "$TMP/tiers")" ] && pass "no tier file left after the failure" \
  || fail "left behind after the failure: $(ls -A "$TMP/tiers")"

# Retrieval: at 5% of recall-1024's context, PQCache answers the first 10 prompts.
R=$MODELS/recall
if "$KVS_BIN" eval --task recall -m "$R/recall.bin" --tokenizer "$R/recall-tok.bin" -t 2 \
  --prompts "$R/prompts/recall-1024" --kv pqcache --budget 0.05 --limit 10 \
  --json "$TMP/r.json" >"$TMP/table" 2>"$TMP/err"; then
  acc=$(grep -o '"accuracy": [^,}]*' "$TMP/r.json" | head -1 | sed 's/.*: //')
  python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" \
    && pass "recall-1024 at 5%: accuracy $acc" || fail "recall-1024 at 5%: accuracy $acc"
else
  fail "recall eval with pqcache: $(head -c 300 "$TMP/err")"
fi
finish
