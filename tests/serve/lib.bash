# Shared by the `kvslim serve` tests (sourced after tests/cli/lib.bash): start a server on a free
# loopback port, wait until it answers, stop it and check how it exited. Every server started
# here is killed at exit, whatever happens to the test.
SERVE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SERVE_MODEL=$MODELS/gguf/stories260K-f32.gguf
SERVE_MODEL_ID=$(basename "$SERVE_MODEL")
# Debian's python3 (the standard library only): a version manager's shim can take a second to start.
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3
SERVE_PIDS=()      # servers, killed at exit if still running
SERVE_CHILDREN=()  # other background commands, sent SIGTERM at exit
SERVE_LOGS=()

serve_cleanup() {
  local pid
  for pid in "${SERVE_CHILDREN[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${SERVE_PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      echo "(killing server $pid left running)"
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  if [ "$failures" -gt 0 ]; then
    local log
    for log in "${SERVE_LOGS[@]}"; do
      [ -f "$log" ] && { echo "--- last lines of $(basename "$log")"; tail -n 15 "$log"; }
    done
  fi
  rm -rf "$TMP"
}
trap serve_cleanup EXIT
# A test stopped by a signal cleans up too (bash runs no EXIT trap when a signal kills it).
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# run_bg CMD...: runs CMD in the background and waits for it, so that a signal to the test is
# handled at once (bash defers traps while a foreground command runs); its exit status is
# returned, and it is sent SIGTERM if the test ends first.
run_bg() {
  local status=0
  "$@" &
  SERVE_CHILDREN+=($!)
  wait $! || status=$?
  return "$status"
}

# serve_watchdog PID: kills server PID if this test dies without its EXIT trap (SIGKILL); ends
# with the server. Holds none of the test's output, so ctest does not wait for it.
serve_watchdog() {
  local pid=$1 test=$$
  ( while kill -0 "$pid" 2>/dev/null; do
      if ! kill -0 "$test" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; exit 0; fi
      sleep 0.5
    done ) </dev/null >/dev/null 2>&1 &
}

# serve_start NAME ARGS...: runs `kvslim serve -m SERVE_MODEL --port 0 ARGS...` with its stderr in
# $TMP/NAME.log, waits (30 s at most) for its listen line and for /health 200. Sets SERVE_PID,
# SERVE_URL (http://HOST:PORT), SERVE_PORT and SERVE_LOG. Any failure ends the test.
serve_start() {
  local name=$1; shift
  SERVE_LOG=$TMP/$name.log
  "$KVS_BIN" serve -m "$SERVE_MODEL" --host 127.0.0.1 --port 0 "$@" >"$TMP/$name.out" 2>"$SERVE_LOG" &
  SERVE_PID=$!
  SERVE_PIDS+=("$SERVE_PID")
  SERVE_LOGS+=("$SERVE_LOG")
  serve_watchdog "$SERVE_PID"
  local i line=""
  for i in $(seq 300); do
    line=$(grep -m 1 -o 'kvslim serve: listening on http://[^ ]*' "$SERVE_LOG" || true)
    [ -n "$line" ] && break
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$line" ]; then
    fail "server $name: no 'kvslim serve: listening on http://HOST:PORT' line within 30 s: $(head -c 400 "$SERVE_LOG")"
    finish; exit 1
  fi
  SERVE_URL=${line#kvslim serve: listening on }
  SERVE_PORT=${SERVE_URL##*:}
  export SERVE_URL
  local code=""
  for i in $(seq 300); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$SERVE_URL/health" || true)
    [ "$code" = 200 ] && break
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [ "$code" != 200 ]; then
    fail "server $name: /health is $code, not 200, after 30 s: $(head -c 400 "$SERVE_LOG")"
    finish; exit 1
  fi
  echo "server $name: $SERVE_URL (pid $SERVE_PID, $*)"
}

# serve_stop PID [SIGNAL [WHAT [PORT]]]: sends SIGNAL (TERM; "-": none, it was sent already),
# waits 20 s at most; the server must exit 0 and its port must be free afterwards.
serve_stop() {
  local pid=$1 sig=${2:-TERM} what=${3:-server} port=${4:-$SERVE_PORT} i status=0
  [ "$sig" = - ] || kill -"$sig" "$pid" 2>/dev/null || true
  for i in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "$what: still running 20 s after SIG$sig; killed"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" || status=$?
  [ "$status" -eq 0 ] && pass "$what: exit 0 after SIG$sig" || fail "$what: exit status $status after SIG$sig"
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health" || true)
  if [ "$code" = 000 ]; then pass "$what: port $port released"; else fail "$what: port $port still answers ($code)"; fi
}

# http METHOD PATH [BODY [CURL ARGS...]]: one request to SERVE_URL; the response body goes to
# $TMP/body, its headers to $TMP/headers; prints the status code. A BODY starting with @ names a
# file. SERVE_KEY, when set, is sent as the Bearer token.
http() {
  local method=$1 path=$2 body=${3-}; shift 3 2>/dev/null || shift $#
  local args=(-s -X "$method" -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' --max-time 30)
  [ -n "${SERVE_KEY:-}" ] && args+=(-H "Authorization: Bearer $SERVE_KEY")
  [ -n "$body" ] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
  curl "${args[@]}" "$@" "$SERVE_URL$path" || true
}

# node_setup: the node clients in $KVS_BUILD_DIR/serve-node (tests/serve/setup.sh); sets NODE_DIR.
node_setup() {
  NODE_DIR=$KVS_BUILD_DIR/serve-node
  if ! bash "$SERVE_DIR/setup.sh" 2>"$TMP/setup.err"; then
    fail "node setup (tests/serve/setup.sh): $(cat "$TMP/setup.err")"
    finish; exit 1
  fi
}

# metric NAME_WITH_LABELS FILE: the value of one sample of a Prometheus text file (empty if absent).
metric() {
  awk -v m="$1" '$1 == m { print $2; exit }' "$2"
}

# serve_relay FILE: counts a node script's "ok: ..." and "FAIL: ..." lines as this test's passes
# and failures, and echoes the rest.
serve_relay() {
  local line
  while IFS= read -r line; do
    case $line in
      ok:\ *) pass "${line#ok: }" ;;
      FAIL:\ *) fail "${line#FAIL: }" ;;
      *) echo "$line" ;;
    esac
  done <"$1"
}
