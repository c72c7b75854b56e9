#!/usr/bin/env bash
# `kvslim serve` with concurrent sessions: 4 generations at once on 2 sequences of 2 threads
# each (two wait in the queue and get a freed sequence), streamed and whole, completions and
# chat, different KV policies, with /metrics and /tokenize scraped meanwhile. Every answer is
# 200 and whole, and the server exits 0 on SIGTERM. `make tsan` runs this test on a
# ThreadSanitizer build (TSAN_OPTIONS=halt_on_error=1): a data race makes the server exit
# non-zero and print a "WARNING: ThreadSanitizer" report, either of which fails the test.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/../serve/lib.bash"
serve_start main --parallel 2 --queue 4 -t 2
post() { # OUT PATH BODY: one request in the background; its status goes to OUT.status
  curl -s -o "$1" -w '%{http_code}' --max-time 120 -H 'Content-Type: application/json' \
    --data-binary "$3" "$SERVE_URL$2" >"$1.status" 2>/dev/null &
  SERVE_CHILDREN+=($!)
}
post "$TMP/r1" /v1/completions '{"prompt":"Once upon a time","max_tokens":24,"stream":true}'
post "$TMP/r2" /v1/completions '{"prompt":"The cat","max_tokens":24,"ignore_eos":true,"kv":"streaming:budget=0.5"}'
post "$TMP/r3" /v1/chat/completions '{"messages":[{"role":"user","content":"Tell a story"}],"max_tokens":24,"stream":true,"kv":"snapkv:budget=0.5"}'
post "$TMP/r4" /v1/chat/completions '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":24,"ignore_eos":true,"kv_type":"f32"}'
post "$TMP/r5" /tokenize '{"content":"Once upon a time"}'
curl -s -o "$TMP/m" -w '%{http_code}' --max-time 60 "$SERVE_URL/metrics" >"$TMP/m.status" || true
wait "${SERVE_CHILDREN[@]}" || true
for r in r1 r2 r3 r4 r5 m; do
  s=$(cat "$TMP/$r.status" 2>/dev/null || true)
  [ "$s" = 200 ] && pass "$r: 200" || fail "$r: status ${s:-none}: $(head -c 300 "$TMP/$r" 2>/dev/null)"
done
for r in r1 r3; do
  tail -n 2 "$TMP/$r" | grep -q '^data: \[DONE\]$' && pass "$r: stream ends with [DONE]" \
    || fail "$r: stream does not end with [DONE]: $(tail -c 200 "$TMP/$r")"
done
# ignore_eos: a sampled end-of-text as the first token would otherwise end a reply at 0 tokens
for r in r2 r4; do
  n=$(jq -r '.usage.completion_tokens' "$TMP/$r" 2>/dev/null || true)
  [ "$n" = 24 ] && pass "$r: $n tokens" || fail "$r: not 24 tokens: $(head -c 300 "$TMP/$r")"
done
n=$(grep -c 'POST /v1/.*completions 200' "$SERVE_LOG" || true)
[ "$n" -eq 4 ] && pass "server log: 4 generations answered 200" || fail "server log: $n generations answered 200"
serve_stop "$SERVE_PID"
if grep -q 'ThreadSanitizer' "$SERVE_LOG"; then
  fail "ThreadSanitizer report: $(grep -A 12 -m 1 'WARNING: ThreadSanitizer' "$SERVE_LOG")"
else
  pass "no ThreadSanitizer report"
fi
finish
