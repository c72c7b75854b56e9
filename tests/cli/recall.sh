#!/usr/bin/env bash
# kvslim eval --task recall on the recall model (../shared/models/recall): the full cache answers
# every prompt with margin 24, StreamingLLM at 10% can fail, JSON/CSV carry their fields, a
# quest spec whose dense layers cover the model is warned about, --plot writes a PNG, and bad
# prompt sets or outputs fail cleanly (exit 1, or 2 for bad usage) without writing an output file.
source "$(dirname "$0")/lib.bash"
R=$MODELS/recall
P=$R/prompts
RECALL=("$KVS_BIN" eval --task recall -m "$R/recall.bin" --tokenizer "$R/recall-tok.bin" -t 1)

# expect_exit CODE DESCRIPTION PATTERN CMD...: exit status CODE, PATTERN on stderr, no output.
expect_exit() {
  local code=$1 what=$2 pattern=$3; shift 3
  local status=0
  rm -f "$TMP/o.json" "$TMP/o.csv"
  "$@" --json "$TMP/o.json" --csv "$TMP/o.csv" >"$TMP/out" 2>"$TMP/err" || status=$?
  if [ "$status" != "$code" ]; then
    fail "$what: exit $status, not $code: $(head -c 400 "$TMP/err")"
  elif ! grep -q -- "$pattern" "$TMP/err"; then
    fail "$what: stderr lacks '$pattern': $(head -c 400 "$TMP/err")"
  elif [ -e "$TMP/o.json" ] || [ -e "$TMP/o.csv" ]; then
    fail "$what: an output file was written"
  elif [ -s "$TMP/out" ]; then
    fail "$what: stdout not empty: $(head -c 200 "$TMP/out")"
  else
    pass "$what: $(head -n 1 "$TMP/err")"
  fi
}

if "${RECALL[@]}" --prompts "$P/recall-256" --kv full,streaming --budget 0.1 --limit 5 \
  --kv-type f32,kivi4 --json "$TMP/r.json" --csv "$TMP/r.csv" >"$TMP/table" 2>"$TMP/err"
then pass "recall runs"; else fail "recall runs: $(head -c 400 "$TMP/err")"; fi

# The JSON objects are one per line; row PARAMS KV_TYPE FIELD pulls one field.
field() {
  grep "\"params\": \"$1\", \"budget\": [^,]*, \"budget_label\": [^,]*, \"kv_type\": \"$2\"" "$TMP/r.json" |
    grep -o "\"$3\": [^,}]*" | sed 's/.*: //'
}
[ "$(field full f32 accuracy)" = 1 ] && pass "full f32: accuracy 1" \
  || fail "full f32: accuracy '$(field full f32 accuracy)'"
awk -v m="$(field full f32 margin_mean)" 'BEGIN { exit !(m >= 23.99 && m <= 24.01) }' \
  && pass "full f32: margin 24.00" || fail "full f32: margin '$(field full f32 margin_mean)'"
[ "$(field full f32 attended_share)" = 1 ] && pass "full f32: attends every token" \
  || fail "full f32: attended_share '$(field full f32 attended_share)'"
[ "$(field full kivi4 accuracy)" = 1 ] && pass "full kivi4: accuracy 1" \
  || fail "full kivi4: accuracy '$(field full kivi4 accuracy)'"
acc=$(field streaming:budget=0.1 f32 accuracy)
awk -v a="$acc" 'BEGIN { exit !(a != "" && a < 1) }' && pass "streaming 0.1 fails some: $acc" \
  || fail "streaming 0.1: accuracy '$acc'"
share=$(field streaming:budget=0.1 f32 attended_share)
awk -v s="$share" 'BEGIN { exit !(s > 0.08 && s < 0.12) }' && pass "streaming 0.1 attends ~10%" \
  || fail "streaming 0.1: attended_share '$share'"
[ "$(grep -c '"policy"' "$TMP/r.json")" = 4 ] && pass "four JSON rows (2 policies x 2 types)" \
  || fail "JSON rows: $(grep -c '"policy"' "$TMP/r.json")"
missing=""
for f in policy params budget budget_label kv_type prompts n_prompts accuracy margin_mean attended_share \
  slots_attended_mean kv_bytes_mean; do
  grep -q "\"$f\": " "$TMP/r.json" || missing="$missing $f"
done
[ -z "$missing" ] && pass "JSON fields" || fail "JSON lacks:$missing"
[ "$(field full f32 prompts)" = '"recall-256"' ] && [ "$(field full f32 n_prompts)" = 5 ] \
  && pass "JSON names the prompt set" || fail "prompts '$(field full f32 prompts)'"
# CSV: a header and one row per configuration and prompt, with the answer's piece.
[ "$(wc -l <"$TMP/r.csv")" = 21 ] && pass "CSV: 20 prompt rows" || fail "CSV lines $(wc -l <"$TMP/r.csv")"
head -n 1 "$TMP/r.csv" | grep -q '^policy,params,budget_label,kv_type,prompts,prompt,' \
  && pass "CSV header" || fail "CSV header: $(head -n 1 "$TMP/r.csv")"
grep -q '^"full","full","-","f32","recall-256","000",254,256,0.5378,118,1,1,23.99.*,"V116","V116",' "$TMP/r.csv" \
  && pass "CSV row of prompt 000" || fail "CSV row 000: $(sed -n 2p "$TMP/r.csv")"
grep -q '^| recall-256 | full | - | f32 | 5 | 100.0% | 24.00 | 1.0000 |' "$TMP/table" \
  && pass "table row" || fail "table: $(cat "$TMP/table")"
[ "$(grep -c 'done in' "$TMP/err")" = 4 ] && pass "one stderr line per configuration" \
  || fail "stderr: $(head -c 300 "$TMP/err")"

# The attended share layer by layer: quest with dense_layers=1 attends all of layer 0 and a
# small share of layer 1; the full cache all of both.
"${RECALL[@]}" --prompts "$P/recall-1024" --kv full --kv quest:dense_layers=1 --budget 0.05 \
  --limit 2 --json "$TMP/layers.json" >/dev/null 2>&1 || fail "per-layer share run"
python3 - "$TMP/layers.json" <<'PY' && pass "attended share per layer" || fail "attended_share_layers: $(head -c 600 "$TMP/layers.json")"
import json, sys
d = json.load(open(sys.argv[1])); rows = d["rows"] if isinstance(d, dict) else d
full = [r for r in rows if r["policy"] == "full"][0]["attended_share_layers"]
quest = [r for r in rows if r["policy"] == "quest"][0]["attended_share_layers"]
assert full == [1, 1], full
assert len(quest) == 2 and quest[0] == 1 and 0 < quest[1] < 0.2, quest
PY
# Needle kept: the recall model answers when, and only when, its retrieval layer (the last)
# still holds the needle (README of the model), so for policies that attend what they keep
# accuracy equals the share of needles kept; quest and the full cache keep every needle.
"${RECALL[@]}" --prompts "$P/recall-1024" --kv full --kv streaming --kv snapkv --kv quest:dense_layers=0 \
  --budget 0.1 --limit 20 --json "$TMP/needle.json" --csv "$TMP/needle.csv" >/dev/null 2>&1 \
  || fail "needle kept run"
python3 - "$TMP/needle.json" "$TMP/needle.csv" <<'PY' && pass "needle kept: equals accuracy where attended = kept" || fail "needle kept: $(head -c 800 "$TMP/needle.json")"
import csv, json, sys
d = json.load(open(sys.argv[1])); rows = d["rows"] if isinstance(d, dict) else d
by = {r["policy"]: r for r in rows}
assert by["full"]["needle_kept_layers"] == [1, 1], by["full"]
assert by["quest"]["needle_kept_layers"][1] == 1, by["quest"]
for p in ("streaming", "snapkv"):
    k = by[p]["needle_kept_layers"][1]
    assert k < 1 and abs(k - by[p]["accuracy"]) < 1e-9, (p, k, by[p]["accuracy"])
per = [r for r in csv.DictReader(open(sys.argv[2])) if r["policy"] == "snapkv"]
assert len(per) == 20 and all((r["needle_kept_last_layer"] == "1.0000") == (r["n_correct"] == "1") for r in per)
PY
# Quest's default dense_layers=2 covers both layers of this model: warned.
"${RECALL[@]}" --prompts "$P/recall-256" --kv quest:budget=0.1 --limit 2 >/dev/null 2>"$TMP/err" \
  && grep -q 'warning: --kv quest:budget=0.1: dense_layers=2 covers all 2 layers' "$TMP/err" \
  && pass "quest dense_layers warning" || fail "quest warning: $(head -c 300 "$TMP/err")"
"${RECALL[@]}" --prompts "$P/recall-256" --kv quest:budget=0.1,dense_layers=1 --limit 2 \
  >/dev/null 2>"$TMP/err" && ! grep -q warning "$TMP/err" \
  && pass "quest dense_layers=1: no warning" || fail "quest dense_layers=1: $(head -c 300 "$TMP/err")"

# Bad prompt sets: exit 1, the file (and line) named, no output written.
mkdir -p "$TMP/empty" "$TMP/bad_answer" "$TMP/big_id" "$TMP/no_q" "$TMP/no_answer"
expect_exit 1 "no .tokens files" "--prompts $TMP/empty: no .tokens files" \
  "${RECALL[@]}" --prompts "$TMP/empty" --kv full
cp "$P/recall-256/000.tokens" "$TMP/bad_answer/"
printf '255 500\n256 V042\n' >"$TMP/bad_answer/000.answer"
expect_exit 1 "malformed .answer" "$TMP/bad_answer/000.answer:2: expected 'POS ID'" \
  "${RECALL[@]}" --prompts "$P/recall-256" --prompts "$TMP/bad_answer" --kv full
sed '5s/.*/600/' "$P/recall-256/000.tokens" >"$TMP/big_id/000.tokens"
cp "$P/recall-256/000.answer" "$TMP/big_id/"
expect_exit 1 "token id >= vocab" "$TMP/big_id/000.tokens: token id 600 (token 5 of the file)" \
  "${RECALL[@]}" --prompts "$TMP/big_id" --kv full
sed 's/^3$/4/' "$P/recall-256/000.tokens" >"$TMP/no_q/000.tokens"
cp "$P/recall-256/000.answer" "$TMP/no_q/"
expect_exit 1 "prompt without Q" "$TMP/no_q/000.tokens: no question token Q" \
  "${RECALL[@]}" --prompts "$TMP/no_q" --kv full
cp "$P/recall-256/000.tokens" "$TMP/no_answer/"
expect_exit 1 "missing .answer" "$TMP/no_answer/000.answer" \
  "${RECALL[@]}" --prompts "$TMP/no_answer" --kv full
expect_exit 1 "missing directory" "--prompts $TMP/nowhere: No such file" \
  "${RECALL[@]}" --prompts "$TMP/nowhere" --kv full

mkdir -p "$TMP/bad_manifest"
cp "$P/recall-256/000.tokens" "$P/recall-256/000.answer" "$TMP/bad_manifest/"
printf 'name\tdepth\tdistance\n000\thalf\t3\n' >"$TMP/bad_manifest/manifest.tsv"
expect_exit 1 "malformed manifest" "$TMP/bad_manifest/manifest.tsv:2: depth 'half'" \
  "${RECALL[@]}" --prompts "$TMP/bad_manifest" --kv full

# Bad usage: exit 2.
expect_exit 2 "no --prompts" "needs -m MODEL, at least one --prompts DIR" \
  "${RECALL[@]}" --kv full
expect_exit 2 "checkpoint without --tokenizer" "is a llama2.c checkpoint: give its tokenizer" \
  "$KVS_BIN" eval --task recall -m "$R/recall.bin" --prompts "$P/recall-256" --kv full
expect_exit 2 "unknown KV type" "unknown type 'q9'" \
  "${RECALL[@]}" --prompts "$P/recall-256" --kv full --kv-type f32,q9
expect_exit 2 "empty KV type" "--kv-type 'f32,,f16': empty item" \
  "${RECALL[@]}" --prompts "$P/recall-256" --kv full --kv-type f32,,f16
expect_exit 2 "budget over the context" "slots" \
  "${RECALL[@]}" --prompts "$P/recall-256" --kv h2o --budget slots=5000
expect_exit 2 "a fidelity flag" "unknown option '--prompt-len'" \
  "${RECALL[@]}" --prompts "$P/recall-256" --kv full --prompt-len=3
expect_exit 2 "unknown task" "unknown task 'bogus'" \
  "$KVS_BIN" eval --task bogus -m "$R/recall.bin" --kv full
"$KVS_BIN" eval --task recall --help >"$TMP/rhelp" && grep -q -- '--prompts DIR' "$TMP/rhelp" && pass "recall --help" \
  || fail "recall --help"
grep -q -- '--plot OUT.png' "$TMP/rhelp" && pass "recall --help lists --plot" || fail "recall --help: no --plot"

# --plot: one PNG with the heat maps and the accuracy-vs-share chart (a few hundred KB for
# this run; the bare axes alone would be far smaller).
if command -v gnuplot >/dev/null; then
  if "${RECALL[@]}" --prompts "$P/recall-256" --prompts "$P/recall-1024" --kv full,streaming \
    --budget 0.1,0.25 --limit 5 --plot "$TMP/r.png" >/dev/null 2>"$TMP/err"; then
    python3 - "$TMP/r.png" <<'PY' && pass "--plot writes a PNG" || fail "--plot: $(head -c 400 "$TMP/err")"
import struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", b[:8]
w, h = struct.unpack(">II", b[16:24])
assert len(b) > 30000 and w >= 1000 and h >= 1000, (len(b), w, h)
PY
  else
    fail "--plot run: $(head -c 400 "$TMP/err")"
  fi
fi
# A bad --plot is refused before any run (exit 1, as for --json and --csv), naming --plot.
mkdir -p "$TMP/plotdir"
expect_exit 1 "--plot into a directory" "--plot $TMP/plotdir: is a directory" \
  "${RECALL[@]}" --prompts "$P/recall-256" --kv full --plot "$TMP/plotdir"
[ -d "$TMP/plotdir" ] && [ -z "$(ls -A "$TMP/plotdir")" ] && pass "--plot directory untouched" \
  || fail "--plot directory changed"
expect_exit 1 "--plot without gnuplot" "--plot: gnuplot was not found on PATH" \
  env PATH=/nonexistent "${RECALL[@]}" --prompts "$P/recall-256" --kv full --plot "$TMP/np.png"
[ ! -e "$TMP/np.png" ] && pass "--plot without gnuplot writes nothing" || fail "--plot wrote $TMP/np.png"
"$KVS_BIN" eval --help >"$TMP/help" && grep -q -- '--task TASK' "$TMP/help" && pass "eval --help lists --task" \
  || fail "eval --help"
finish
