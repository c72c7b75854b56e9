#!/usr/bin/env bash
# Evicting policies run past the context (512 for stories260K): a prompt of ~2600 tokens and
# decoding after it, with position shifting (--context-shift) and without; the full cache and
# other non-evicting policies keep the context limit; shifting needs an evicting policy.
source "$(dirname "$0")/lib.bash"
model=$MODELS/gguf/stories260K-f32.gguf
for i in $(seq 100); do
  printf 'Once upon a time, there was a little girl named Lily. She liked to play outside. '
done >"$TMP/long.txt"

long_run() { # DESCRIPTION ARGS...: a 2602-token prompt and 64 generated tokens
  local what=$1; shift
  if "$KVS_BIN" run -m "$model" -f "$TMP/long.txt" -n 64 --temp 0 "$@" >"$TMP/out" 2>"$TMP/err" &&
     grep -q 'prompt 2602 tokens, generated 64 tokens' "$TMP/err"; then
    pass "$what: $(tail -n 1 "$TMP/err")"
  else
    fail "$what: $(head -c 400 "$TMP/err")"
  fi
}
long_run "streaming, shifted" --kv streaming:slots=64 --context-shift
long_run "streaming, unshifted" --kv streaming:slots=64
long_run "streaming, shift=on in the spec" --kv streaming:slots=64,shift=on
long_run "h2o, shifted" --kv h2o:slots=128 --context-shift
long_run "hashevict, shifted" --kv hashevict:slots=64 --context-shift
# The text after the prompt is text: words, not a soup of byte tokens.
"$KVS_BIN" run -m "$model" -f "$TMP/long.txt" -n 200 --temp 0 --kv streaming:slots=64 \
  --context-shift >"$TMP/out" 2>/dev/null || true
tail -c 600 "$TMP/out" | grep -Eq '(\b[A-Za-z]+\b[ ,.]+){20}' && pass "shifted text reads as words" \
  || fail "shifted text: $(tail -c 300 "$TMP/out")"

# Generation without end: --ignore-eos feeds story ends back, shifting keeps positions inside
# the 512-token context; 3000 tokens come out, with the KV cache at its 64 slots.
"$KVS_BIN" run -m "$model" -p "Once upon a time" -n 3000 --kv streaming:slots=64 --context-shift \
  --ignore-eos >"$TMP/out" 2>"$TMP/err" && grep -q 'generated 3000 tokens' "$TMP/err" \
  && ! grep -q 'context' "$TMP/err" && pass "3000 tokens past the context: $(tail -n 1 "$TMP/err")" \
  || fail "--ignore-eos --context-shift -n 3000: $(head -c 300 "$TMP/err")"

# --progress N: a line on stderr every N generated tokens, counting them (bench/soak.sh reads it).
"$KVS_BIN" run -m "$model" -p "Once upon a time" -n 2500 --kv streaming:slots=64 --context-shift \
  --ignore-eos --progress 1000 >/dev/null 2>"$TMP/err"
[ "$(grep -c '^kvslim run: progress: generated [12]000 tokens, [0-9.]* s, [0-9.]* tok/s$' "$TMP/err")" = 2 ] \
  && [ "$(grep -c progress "$TMP/err")" = 2 ] && pass "--progress 1000: $(grep progress "$TMP/err" | tail -n 1)" \
  || fail "--progress 1000: $(head -c 300 "$TMP/err")"
expect_fail "--progress with --chat" "not taken with --chat" \
  "$KVS_BIN" run -m "$model" --chat --progress 10 -p hi

expect_fail "full cache, long prompt" "exceeds the context" \
  "$KVS_BIN" run -m "$model" -f "$TMP/long.txt" -n 4
expect_fail "snapkv, long prompt" "exceeds the context" \
  "$KVS_BIN" run -m "$model" -f "$TMP/long.txt" -n 4 --kv snapkv:slots=64
expect_fail "shifting with the full cache" "needs an evicting KV policy" \
  "$KVS_BIN" run -m "$model" -p "Once upon a time" -n 4 --context-shift
expect_fail "shifting with a budget of the whole context" "budget below the context" \
  "$KVS_BIN" run -m "$model" -p "Once upon a time" -n 4 --kv streaming:slots=512 --context-shift
finish
