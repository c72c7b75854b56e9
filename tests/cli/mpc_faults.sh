#!/usr/bin/env bash
# Faults in two-party secure inference (kvslim mpc): every role exits 1 within a bounded time
# (--timeout 8; a case fails past 25 s), with a message naming what went wrong, leaves no role
# process behind and prints no key-like bytes (32 or more hex digits) when: the dealer kills
# itself mid-run (the test-only hook KVS_MPC_TEST_KILL=dealer:K) under `mpc run` and under the
# standalone roles; party 1 claims another protocol version (KVS_MPC_TEST_VERSION), serves
# another model than party 0 expects, or uses other fraction bits; and a TCP proxy between the
# parties flips one byte of party 1's stream, or cuts it in the middle of a message.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
Q8=$MODELS/gguf/stories260K-q8_0.gguf
P="Once upon a time"
tag="kvs-mpc-faults-$$-$RANDOM" # a unique argument, to find our processes with pgrep
LIMIT=25                        # seconds a case may take, all its processes included
bg_pids=()
cleanup() {
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  local left
  left=$(pgrep -f "$tag" || true)
  [ -z "$left" ] || kill -9 $left 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
have_py() { command -v python3 >/dev/null; }

declare -A pid st el
# start NAME [VAR=VALUE...] -- ARGS...: `kvslim mpc ARGS` in the background, its output in
# $TMP/NAME.out and $TMP/NAME.err. A subshell wraps it so that bash prints no "Killed" notice.
start() {
  local name=$1 envs=()
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  (env "${envs[@]}" "$KVS_BIN" mpc "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"; exit $?) 2>/dev/null &
  pid[$name]=$!
  bg_pids+=("$!")
}
# reap NAME...: waits for them all until $t0 + LIMIT: st[NAME] the exit status ("hung" if it
# still ran, then killed), el[NAME] the seconds from $t0 to its end.
reap() {
  local name s running=("$@") left
  while [ "${#running[@]}" -gt 0 ]; do
    left=()
    for name in "${running[@]}"; do
      if kill -0 "${pid[$name]}" 2>/dev/null; then
        left+=("$name")
      else
        s=0; wait "${pid[$name]}" || s=$?
        st[$name]=$s; el[$name]=$((SECONDS - t0))
      fi
    done
    running=("${left[@]}")
    [ "${#running[@]}" -gt 0 ] || break
    if [ $((SECONDS - t0)) -gt "$LIMIT" ]; then
      for name in "${running[@]}"; do
        pkill -9 -P "${pid[$name]}" 2>/dev/null || true
        wait "${pid[$name]}" 2>/dev/null || true
        st[$name]=hung; el[$name]=$((SECONDS - t0))
      done
      break
    fi
    sleep 0.1
  done
}
# expect_exit CASE NAME STATUS PATTERN: NAME exited with STATUS within LIMIT, PATTERN on its stderr
# ("": anything); the pass line shows the first line with PATTERN.
expect_exit() {
  local what="$1: $2" want=$3 pattern=$4 name=$2
  if [ "${st[$name]}" != "$want" ]; then
    fail "$what: exit ${st[$name]} (expected $want) after ${el[$name]} s: $(head -c 400 "$TMP/$name.err")"
  elif [ "${el[$name]}" -gt "$LIMIT" ]; then
    fail "$what: took ${el[$name]} s"
  elif [ -n "$pattern" ] && ! grep -q -- "$pattern" "$TMP/$name.err"; then
    fail "$what: stderr lacks '$pattern': $(head -c 400 "$TMP/$name.err")"
  else
    pass "$what (exit $want, ${el[$name]} s): $(grep -m 1 -- "$pattern" "$TMP/$name.err" || echo "(nothing on stderr)")"
  fi
}
# after_case CASE CTAG NAME...: no stderr shows 32 hex digits; no process with CTAG is left.
after_case() {
  local what=$1 ctag=$2 name leaked=""
  shift 2
  for name in "$@"; do
    grep -q "[0-9a-fA-F]\{32\}" "$TMP/$name.err" && leaked="$leaked $name"
  done
  [ -z "$leaked" ] && pass "$what: no key-like bytes in the errors" \
    || fail "$what: 32 hex digits (a key or share?) on the stderr of$leaked"
  sleep 0.2
  pgrep -f "$ctag" >/dev/null && fail "$what: processes left: $(pgrep -af "$ctag")" \
    || pass "$what: no role left running"
}
# keys CTAG: fresh keys $TMP/CTAG.{peer,d0,d1}.key (the tag is in every role's arguments)
keys() {
  for k in peer d0 d1; do
    if command -v openssl >/dev/null; then openssl rand -hex 32 >"$TMP/$1.$k.key"
    else head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/$1.$k.key"; fi
  done
}
# roles CTAG DEALER_ENV P1_ENV P0_ENV PEER_PORT P1_ARGS... -- P0_ARGS...: the dealer, party 1
# and party 0 as in mpc.sh's standalone section (an ENV is "" or one VAR=VALUE), then reap.
roles() {
  local ctag=$1 denv=$2 p1env=$3 p0env=$4 peer=$5 p1args=() p0args=()
  shift 5
  while [ "$1" != -- ]; do p1args+=("$1"); shift; done
  shift
  p0args=("$@")
  start dealer $denv -- dealer --listen "$port" --key0 "$TMP/$ctag.d0.key" \
    --key1 "$TMP/$ctag.d1.key" --timeout 8
  start p1 $p1env -- party --role 1 --listen $((port + 1)) --dealer "127.0.0.1:$port" \
    --peer-key "$TMP/$ctag.peer.key" --dealer-key "$TMP/$ctag.d1.key" --timeout 8 "${p1args[@]}"
  start p0 $p0env -- party --role 0 -p "$P" -n 8 --peer "127.0.0.1:$peer" \
    --dealer "127.0.0.1:$port" --peer-key "$TMP/$ctag.peer.key" --dealer-key "$TMP/$ctag.d0.key" \
    --timeout 8 "${p0args[@]}"
  reap p0 p1 dealer
}
newport() { free_ports 3; } # dealer, party 1, the proxy

# ---- 1. mpc run, the dealer killed mid-run ----
ctag="$tag-run"
t0=$SECONDS
# (the tag goes in the --json path, not in the prompt: a longer prompt makes the steps before
# the kill slower, seconds more on a loaded machine)
start run KVS_MPC_TEST_KILL=dealer:3 -- run -m "$M" -p "$P" -n 8 --timeout 8 --json "$TMP/$ctag.json"
reap run
expect_exit "mpc run, dealer killed" run 1 "the dealer was killed by signal 9"
after_case "mpc run, dealer killed" "$ctag" run

# ---- 2. standalone roles, the dealer killed mid-run ----
ctag="$tag-dealer"; keys "$ctag"; newport; t0=$SECONDS
roles "$ctag" KVS_MPC_TEST_KILL=dealer:3 "" "" $((port + 1)) -m "$M" -- -m "$M"
expect_exit "standalone, dealer killed" dealer 137 ""
# Party 1 sees the dealer link close; party 0 sees either the dealer or party 1 leave first
# (whichever closes first): it names that link.
expect_exit "standalone, dealer killed" p1 1 "the dealer closed the connection"
expect_exit "standalone, dealer killed" p0 1 "closed the connection"
after_case "standalone, dealer killed" "$ctag" dealer p1 p0

# ---- 3. protocol version mismatch: party 1 claims version 3 (the real one is 2) ----
ctag="$tag-version"; keys "$ctag"; newport; t0=$SECONDS
roles "$ctag" "" KVS_MPC_TEST_VERSION=3 "" $((port + 1)) -m "$M" -- -m "$M"
# Party 1 meets the dealer first: both name the versions. Party 0 never sees party 1's hello: it
# sees party 1 leave during the handshake, or finds the dealer gone (a race), so no fixed wording.
expect_exit "version mismatch" p1 1 "link to the dealer: peer speaks protocol version 2, we speak 3"
expect_exit "version mismatch" dealer 1 "link to party 1: peer speaks protocol version 3, we speak 2"
expect_exit "version mismatch" p0 1 "kvslim mpc (party 0): "
after_case "version mismatch" "$ctag" dealer p1 p0

# ---- 4. model mismatch: party 1 serves the q8_0 file, party 0 expects the f32 file's hash ----
ctag="$tag-model"; keys "$ctag"; newport; t0=$SECONDS
roles "$ctag" "" "" "" $((port + 1)) -m "$Q8" -- -m "$M"
expect_exit "model mismatch" p0 1 "link to party 1: peer's model hash differs"
expect_exit "model mismatch" p1 1 "link to party 0: peer's model hash differs"
expect_exit "model mismatch" dealer 1 "closed the connection"
after_case "model mismatch" "$ctag" dealer p1 p0

# ---- 5. fraction bits mismatch: party 1 --frac 12, the others 16 ----
ctag="$tag-frac"; keys "$ctag"; newport; t0=$SECONDS
roles "$ctag" "" "" "" $((port + 1)) -m "$M" --frac 12 -- -m "$M"
expect_exit "frac mismatch" p1 1 "link to the dealer: peer uses 16 fraction bits, we use 12"
expect_exit "frac mismatch" dealer 1 "link to party 1: peer uses 12 fraction bits, we use 16"
# Party 0 loses the dealer: before or after it connected (a race), so no fixed wording.
expect_exit "frac mismatch" p0 1 "kvslim mpc (party 0): "
after_case "frac mismatch" "$ctag" dealer p1 p0

# ---- 6. the party link through a proxy that corrupts or cuts party 1's stream ----
# proxy.py MODE LISTEN UPSTREAM AT READY: accepts party 0 on LISTEN, connects to party 1 on
# UPSTREAM (retrying until party 1 listens) and forwards both ways; "flip" flips byte AT of party 1's stream, "cut" forwards AT
# bytes of it then closes both connections.
cat >"$TMP/proxy.py" <<'EOF'
import socket, sys, threading, time
mode, lport, uport, at, ready = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", lport))
ls.listen(1)
ls.settimeout(15)
open(ready, "w").close()
c, _ = ls.accept()
deadline = time.time() + 15
while True:  # party 1 listens once it has loaded the model: retry, as party 0 would
    try:
        u = socket.create_connection(("127.0.0.1", uport), timeout=15)
        break
    except ConnectionRefusedError:
        if time.time() > deadline:
            raise
        time.sleep(0.05)
done = threading.Event()
total = {}
def pump(src, dst, name, tamper):
    n = 0
    try:
        while not done.is_set():
            b = src.recv(65536)
            if not b:
                break
            if tamper and mode == "cut" and n + len(b) >= at:
                dst.sendall(b[:at - n])
                n = at
                break
            if tamper and mode == "flip" and n <= at < n + len(b):
                b = bytearray(b)
                b[at - n] ^= 0x01
                b = bytes(b)
            dst.sendall(b)
            n += len(b)
    except OSError:
        pass
    total[name] = n
    done.set()
    for s in (c, u):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
ts = [threading.Thread(target=pump, args=(u, c, "down", True), daemon=True),
      threading.Thread(target=pump, args=(c, u, "up", False), daemon=True)]
for t in ts:
    t.start()
for t in ts:
    t.join(20)
print("%s: %d bytes party 1 -> party 0, %d bytes party 0 -> party 1"
      % (mode, total.get("down", -1), total.get("up", -1)))
EOF
for mode in flip cut; do
  if ! have_py; then pass "proxy $mode: skipped: no python3"; continue; fi
  ctag="$tag-$mode"; keys "$ctag"; newport; t0=$SECONDS
  rm -f "$TMP/ready"
  python3 "$TMP/proxy.py" "$mode" $((port + 2)) $((port + 1)) 4000 "$TMP/ready" \
    >"$TMP/proxy.out" 2>&1 &
  proxy_pid=$!; bg_pids+=("$proxy_pid")
  while [ ! -e "$TMP/ready" ] && kill -0 "$proxy_pid" 2>/dev/null && [ $((SECONDS - t0)) -le 5 ]; do
    sleep 0.05
  done
  roles "$ctag" "" "" "" $((port + 2)) -m "$M" -- -m "$M"
  if [ "$mode" = flip ]; then
    expect_exit "proxy flip" p0 1 "message authentication failed on the link to party 1"
  else
    expect_exit "proxy cut" p0 1 "party 1 closed the connection while we waited for"
  fi
  expect_exit "proxy $mode" p1 1 "kvslim mpc (party 1): "
  case ${st[dealer]} in
    0|1) [ "${el[dealer]}" -le "$LIMIT" ] \
           && pass "proxy $mode: dealer (exit ${st[dealer]}, ${el[dealer]} s): $(head -n 1 "$TMP/dealer.err")" \
           || fail "proxy $mode: dealer took ${el[dealer]} s" ;;
    *) fail "proxy $mode: dealer: exit ${st[dealer]} after ${el[dealer]} s: $(head -c 400 "$TMP/dealer.err")" ;;
  esac
  while kill -0 "$proxy_pid" 2>/dev/null && [ $((SECONDS - t0)) -le "$LIMIT" ]; do sleep 0.1; done
  kill "$proxy_pid" 2>/dev/null && fail "proxy $mode: the proxy still ran after the roles ended"
  wait "$proxy_pid" 2>/dev/null || true
  echo "   proxy: $(cat "$TMP/proxy.out")"
  after_case "proxy $mode" "$ctag" dealer p1 p0
done

echo "$((SECONDS)) s in all"
finish
