#!/usr/bin/env bash
# The full policy through run, logits and eval gives the same logits as the engine without a
# policy argument; the decode path (eval) agrees with the batched prompt path (logits).
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
T=$GOLDEN/stories260K-sample-512.tokens
"$KVS_BIN" logits -m "$M" --tokens "$T" --out "$TMP/plain.f32"
"$KVS_BIN" logits -m "$M" --tokens "$T" --out "$TMP/full.f32" --kv full
cmp -s "$TMP/plain.f32" "$TMP/full.f32" && pass "logits --kv full is bit-identical" \
  || fail "logits --kv full differs"
"$COMPARE" "$TMP/plain.f32" "$TMP/full.f32" 512 --max-abs 1e-6 --label "logits --kv full" || fail "logits"
"$KVS_BIN" run -m "$M" -p "Once upon a time" -n 100 --temp 0 >"$TMP/a" 2>/dev/null
"$KVS_BIN" run -m "$M" -p "Once upon a time" -n 100 --temp 0 --kv full >"$TMP/b" 2>/dev/null
cmp -s "$TMP/a" "$TMP/b" && pass "run --kv full: same text" || fail "run --kv full: text differs"
"$KVS_BIN" logits -m "$M" --tokens "$T" --out "$TMP/f16.f32" --kv-type f16
"$COMPARE" "$TMP/plain.f32" "$TMP/f16.f32" 512 --max-abs 0.1 --label "F16 KV vs F32 KV" \
  && pass "F16 KV within 0.1" || fail "F16 KV"
# eval's full reference rows come from the decode path; KL against itself must be exactly 0
"$KVS_BIN" eval -m "$M" --tokens "$T" --prompt-len 384 --kv full --json "$TMP/e.json" >/dev/null 2>&1
grep -q '"kl": 0[,.}]\|"kl": 0.0*[,}]' "$TMP/e.json" && pass "eval full: KL 0" || fail "eval full: $(head -c 300 "$TMP/e.json")"
finish
