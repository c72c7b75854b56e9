#!/usr/bin/env bash
# The official openai npm client (tests/serve/openai_client.mjs) against `kvslim serve --api-key`:
# models.list, completions and chat completions, streamed and not, with and without a `kv`
# policy; usage consistent, streamed text = plain text, stop strings, typed errors (400, 401).
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/../serve/lib.bash"
node_setup
SERVE_KEY=test-key-$$
serve_start main --api-key "$SERVE_KEY" --parallel 2
export SERVE_KEY SERVE_MODEL_ID
status=0
run_bg timeout 120 node "$NODE_DIR/openai_client.mjs" >"$TMP/client.out" 2>"$TMP/client.err" || status=$?
serve_relay "$TMP/client.out"
[ "$status" -eq 0 ] || fail "openai_client.mjs exit status $status: $(head -c 600 "$TMP/client.err")"
[ "$passes" -ge 30 ] || fail "only $passes checks ran"
# One log line per request, naming the path and the status.
n=$(grep -cE 'POST[^/]*/v1/completions[^0-9]*200' "$SERVE_LOG" || true)
[ "$n" -ge 10 ] && pass "server log: $n lines for POST /v1/completions 200" \
  || fail "server log: $n lines for POST /v1/completions 200: $(tail -n 3 "$SERVE_LOG")"
serve_stop "$SERVE_PID"
finish
