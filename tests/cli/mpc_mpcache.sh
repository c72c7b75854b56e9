#!/usr/bin/env bash
# MPCache under the protocol from the command line (kvslim mpc run --kv mpcache:...): the greedy
# text equals the plaintext policy's (`kvslim run --temp 0 --kv mpcache:...,quant=16`, whose
# static step ranks on the protocol's fixed-point grid), the report and the JSON name the KV
# configuration, two recall prompts of the same length with different needles cost the same bytes,
# messages and rounds per op (and both retrieve their needle), and a configuration the protocol
# cannot run exits 2 naming it.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
P="Once upon a time"
KV=mpcache:budget=0.25,keep=0.5,s1=8,s2=4

status=0
"$KVS_BIN" mpc run -m "$M" -p "$P" -n 16 --kv "$KV" --insecure-plain --json "$TMP/mp.json" \
  >"$TMP/mp.out" 2>"$TMP/mp.err" || status=$?
if [ "$status" = 0 ] && grep -q "^kv: $KV$" "$TMP/mp.out"; then
  pass "mpc run --kv $KV prints the text, the cost table and the KV line"
else
  fail "mpc run --kv: exit $status: $(head -c 600 "$TMP/mp.err") $(head -c 300 "$TMP/mp.out")"
fi
"$KVS_BIN" run -m "$M" -p "$P" -n 16 --temp 0 -t 1 --kv "$KV,quant=16" >"$TMP/plain.out" 2>/dev/null
if command -v python3 >/dev/null && [ "$status" = 0 ]; then
  python3 - "$TMP/mp.json" "$TMP/plain.out" "$P" "$KV" >"$TMP/cmp.out" 2>&1 <<'PY' \
    && pass "the text matches the plaintext policy's: $(tail -n 1 "$TMP/cmp.out")" \
    || fail "text: $(cat "$TMP/cmp.out")"
import json, sys
r = json.load(open(sys.argv[1]))
plain = open(sys.argv[2], encoding="utf-8", errors="replace").read()
prompt = sys.argv[3]
gen = plain[len(prompt):].rstrip("\n") if plain.startswith(prompt) else plain
assert r["kv"] == sys.argv[4], r["kv"]
if r["text"] == gen and len(r["tokens"]) == 16:
    print(repr(gen))
    sys.exit(0)
print("texts differ: mpc %r, plain %r" % (r["text"], gen))
sys.exit(1)
PY
fi

# Two needle prompts of the recall model, same length, different needles: the first 40 context
# tokens of recall-256's prompts 000 and 001, then Q and the first key of each that is followed by
# its value. The transcript's length (every count of the cost report but the wall times) must not
# depend on which tokens the static step keeps and which clusters are chosen.
R=$MODELS/recall
if command -v python3 >/dev/null; then
  for i in 0 1; do
    python3 - "$R/prompts/recall-256/00$i.tokens" "$TMP/needle$i.tokens" "$TMP/needle$i.want" <<'PY'
import sys
t = [int(x) for x in open(sys.argv[1])]
ctx = t[:40]
j = next(k for k in range(1, 39) if 128 <= ctx[k] < 384 and ctx[k + 1] >= 384)
open(sys.argv[2], "w").write("\n".join(map(str, ctx + [3, ctx[j]])) + "\n")
open(sys.argv[3], "w").write("V%03d\n" % (ctx[j + 1] - 384))
PY
    "$KVS_BIN" mpc run -m "$R/recall.bin" --tokenizer "$R/recall-tok.bin" \
      --tokens "$TMP/needle$i.tokens" --prompt-len 40 -n 1 --insecure-plain \
      --kv mpcache:budget=0.25,keep=0.5,s1=8,s2=4,share=off --json "$TMP/needle$i.json" \
      >/dev/null 2>"$TMP/needle$i.err" || fail "needle prompt $i: $(head -c 400 "$TMP/needle$i.err")"
  done
  python3 - "$TMP"/needle{0,1}.json "$TMP"/needle{0,1}.want >"$TMP/needle.out" 2>&1 <<'PY' \
    && pass "two needle prompts of 42 tokens: $(tail -n 1 "$TMP/needle.out")" \
    || fail "needle prompts: $(cat "$TMP/needle.out")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
want = [open(p).read().strip() for p in sys.argv[3:5]]
def counts(d, path=""):
    """Every number of the report but wall times, by path."""
    out = {}
    for k, v in d.items():
        if k in ("text", "tokens", "pieces", "teacher_forced_top1") or "wall" in k:
            continue
        if isinstance(v, dict):
            out.update(counts(v, path + k + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[path + k] = v
    return out
ca, cb = counts(a), counts(b)
diff = [k for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
assert len(ca) > 50, "too few counts in the report: %d" % len(ca)
assert not diff, "counts differ: " + ", ".join("%s %s/%s" % (k, ca.get(k), cb.get(k)) for k in diff[:8])
assert [a["text"], b["text"]] == want, "answers %s, needles %s" % ([a["text"], b["text"]], want)
print("%d counts equal (bytes, messages, rounds, dealer bytes per op and phase); answers %s and %s, "
      "both the needles' values" % (len(ca), a["text"], b["text"]))
PY
fi

usage_fail() { # DESCRIPTION PATTERN CMD...: exit status 2 and PATTERN on stderr
  local what=$1 pattern=$2; shift 2
  local st=0
  "$@" >"$TMP/out" 2>"$TMP/err" || st=$?
  if [ "$st" = 2 ] && grep -q -- "$pattern" "$TMP/err"; then pass "$what: $(head -n 1 "$TMP/err")"
  else fail "$what: exit $st: $(head -c 300 "$TMP/err")"; fi
}
usage_fail "another policy" "runs full or mpcache" \
  "$KVS_BIN" mpc run -m "$M" -p "$P" -n 2 --kv h2o:budget=0.1
usage_fail "a slot budget" "the budget is a share of the prompt" \
  "$KVS_BIN" mpc run -m "$M" -p "$P" -n 2 --kv mpcache:slots=8
usage_fail "a score the protocol does not run" "sim=linear" \
  "$KVS_BIN" mpc run -m "$M" -p "$P" -n 2 --kv mpcache:budget=0.1,sim=maxdot
usage_fail "a bad parameter" "s2=3 does not divide s1=8" \
  "$KVS_BIN" mpc run -m "$M" -p "$P" -n 2 --kv mpcache:budget=0.1,s1=8,s2=3
usage_fail "--kv on party 1" "are party 0's" \
  "$KVS_BIN" mpc party --role 1 -m "$M" --listen 1 --dealer 127.0.0.1:1 --insecure-plain \
  --kv "$KV"
finish
