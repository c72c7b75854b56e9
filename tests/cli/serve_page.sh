#!/usr/bin/env bash
# The comparison page at `/` of `kvslim serve` in headless Chromium (tests/serve/page.mjs, driven
# by puppeteer-core): both panes stream at once (full and nacl:budget=0.5), end "done" with text
# and KV statistics, a server error shows in its pane; on a server with --api-key, the key typed
# is sent and its absence shows the 401. Saves a screenshot to $KVS_BUILD_DIR/serve-page.png.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/../serve/lib.bash"
[ -x /usr/bin/chromium ] || { fail "/usr/bin/chromium is not installed (Debian: chromium)"; finish; exit 1; }
node_setup
serve_start open
OPEN_PID=$SERVE_PID OPEN_URL=$SERVE_URL OPEN_PORT=$SERVE_PORT
KEY=page-key-$$
serve_start keyed --api-key "$KEY"
KEYED_URL=$SERVE_URL
rm -f "$KVS_BUILD_DIR/serve-page.png"
status=0
SERVE_URL=$OPEN_URL KEYED_URL=$KEYED_URL SERVE_KEY=$KEY SCREENSHOT=$KVS_BUILD_DIR/serve-page.png \
  run_bg timeout 120 node "$NODE_DIR/page.mjs" >"$TMP/page.out" 2>"$TMP/page.err" || status=$?
serve_relay "$TMP/page.out"
[ "$status" -eq 0 ] || fail "page.mjs exit status $status: $(grep -v 'unexpected operator' "$TMP/page.err" | head -c 600)"
[ "$passes" -ge 20 ] || fail "only $passes checks ran"
[ -s "$KVS_BUILD_DIR/serve-page.png" ] && pass "screenshot $KVS_BUILD_DIR/serve-page.png: $(wc -c <"$KVS_BUILD_DIR/serve-page.png") bytes" \
  || fail "no screenshot"
serve_stop "$OPEN_PID" TERM "server without a key" "$OPEN_PORT"
serve_stop "$SERVE_PID" TERM "server with --api-key"
finish
