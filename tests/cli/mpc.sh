#!/usr/bin/env bash
# Two-party secure inference from the command line (kvslim mpc): `mpc run` starts the dealer and
# both parties as processes on loopback, prints the greedy text (compared with `kvslim run
# --temp 0`) and the cost table, writes the JSON; --insecure-plain says so and sends fewer wire
# bytes; the standalone roles (`mpc dealer`, `mpc party`) print what `mpc run` prints; bad usage
# exits 2 naming the flag; an unreachable peer or a port in use exits 1; a party killed mid-run
# (the test-only hook KVS_MPC_TEST_KILL) or a parent killed by SIGKILL leaves no process behind.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf
P="Once upon a time"
tag="kvs-mpc-test-$$-$RANDOM" # a unique argument, to find our processes with pgrep
bg_pids=()
cleanup() {
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# ---- mpc run: text, cost table, JSON ----
status=0
"$KVS_BIN" mpc run -m "$M" -p "$P" -n 8 --json "$TMP/enc.json" >"$TMP/enc.out" 2>"$TMP/enc.err" \
  || status=$?
if [ "$status" = 0 ] && grep -q "^$P" "$TMP/enc.out" && grep -q "channels: AES-256-GCM" "$TMP/enc.out" \
   && grep -q "rounds (party 0)" "$TMP/enc.out"; then
  pass "mpc run prints the text and the cost table"
else
  fail "mpc run: exit $status: $(head -c 600 "$TMP/enc.err") $(head -c 300 "$TMP/enc.out")"
fi

"$KVS_BIN" run -m "$M" -p "$P" -n 8 --temp 0 -t 1 >"$TMP/plain_run.out" 2>/dev/null
have_py() { command -v python3 >/dev/null; }
if have_py && [ "$status" = 0 ]; then
  # the generated part of `kvslim run`'s output (it prints the prompt, the text and a newline)
  python3 - "$TMP/enc.json" "$TMP/plain_run.out" "$P" >"$TMP/cmp.out" 2>&1 <<'EOF' \
    && pass "the greedy text matches kvslim run --temp 0's: $(tail -n 1 "$TMP/cmp.out")" \
    || fail "greedy text: $(cat "$TMP/cmp.out")"
import json, sys
r = json.load(open(sys.argv[1]))
plain = open(sys.argv[2], encoding="utf-8", errors="replace").read()
prompt = sys.argv[3]
gen = plain[len(prompt):].rstrip("\n") if plain.startswith(prompt) else plain
if r["text"] == gen:
    print(repr(gen))
    sys.exit(0)
print("texts differ: mpc %r, plain %r" % (r["text"], gen))
sys.exit(1)
EOF
  python3 - "$TMP/enc.json" >"$TMP/keys.out" 2>&1 <<'EOF' \
    && pass "JSON has the per-token costs, ops and flags" || fail "JSON: $(cat "$TMP/keys.out")"
import json, sys
r = json.load(open(sys.argv[1]))
for k in ["online_bytes_per_token", "rounds_per_token", "dealer_bytes_per_token",
          "wall_s_per_token", "lan_s_per_token", "wan_s_per_token", "online_wire_bytes_per_token"]:
    assert isinstance(r[k], (int, float)) and r[k] > 0, (k, r.get(k))
assert r["wan_s_per_token"] > r["lan_s_per_token"]
assert abs(r["online_bytes_party0_per_token"] + r["online_bytes_party1_per_token"]
           - r["online_bytes_per_token"]) <= 1e-6 * r["online_bytes_per_token"]
assert r["online_bytes_party0_per_token"] > 0 and r["online_bytes_party1_per_token"] > 0
assert isinstance(r["text"], str) and len(r["tokens"]) == r["generated"] > 0
assert r["insecure_plain"] is False and r["frac"] == 16
ops = r["ops"]
assert ops and all(set(v) >= {"bytes", "rounds"} for v in ops.values()), ops
assert sum(v["bytes"] for v in ops.values()) > 0 and sum(v["rounds"] for v in ops.values()) > 0
# the dealer's offline bytes per op add up to the total
dealer_ops = sum(v["dealer_bytes"] for v in ops.values())
assert abs(dealer_ops - r["dealer_bytes_per_token"]) <= 1e-6 * r["dealer_bytes_per_token"], (
    dealer_ops, r["dealer_bytes_per_token"])
for ph in ("setup", "prefill", "decode"):
    assert r[ph]["online_bytes"] > 0, ph
EOF
fi

# ---- --insecure-plain: said in the output, fewer wire bytes ----
status=0
"$KVS_BIN" mpc run -m "$M" -p "$P" -n 8 --insecure-plain --json "$TMP/plain.json" \
  >"$TMP/plain.out" 2>"$TMP/plain.err" || status=$?
[ "$status" = 0 ] && grep -q "channels: plain (no encryption) — loopback measurement only" "$TMP/plain.out" \
  && pass "--insecure-plain says so" || fail "--insecure-plain: exit $status: $(head -c 400 "$TMP/plain.err")"
if have_py && [ "$status" = 0 ]; then
  python3 - "$TMP/enc.json" "$TMP/plain.json" >"$TMP/wire.out" 2>&1 <<'EOF' \
    && pass "plain channels send fewer wire bytes: $(cat "$TMP/wire.out")" \
    || fail "wire bytes: $(cat "$TMP/wire.out")"
import json, sys
e, p = (json.load(open(f)) for f in sys.argv[1:3])
assert p["insecure_plain"] is True
we, wp = e["online_wire_bytes_per_token"], p["online_wire_bytes_per_token"]
oe = (we - e["online_bytes_per_token"]) / e["messages_per_token"]
op = (wp - p["online_bytes_per_token"]) / p["messages_per_token"]
print("encrypted %.0f B/token (%.1f B/message over the payload), plain %.0f B/token (%.1f)"
      % (we, oe, wp, op))
assert abs(oe - 36) < 1e-6 and abs(op - 20) < 1e-6, (oe, op)
if e["text"] == p["text"]:  # the same steps: the plain run sends fewer bytes on the wire
    assert wp < we and e["online_bytes_per_token"] == p["online_bytes_per_token"]
EOF
fi

# ---- the standalone roles print what mpc run prints ----
free_ports 2 # the dealer, party 1
for k in peer d0 d1; do
  if command -v openssl >/dev/null; then openssl rand -hex 32 >"$TMP/$k.key"
  else head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/$k.key"; fi
done
"$KVS_BIN" mpc dealer --listen "$port" --key0 "$TMP/d0.key" --key1 "$TMP/d1.key" --timeout 20 \
  >"$TMP/dealer.out" 2>"$TMP/dealer.err" &
dealer_pid=$!; bg_pids+=("$dealer_pid")
"$KVS_BIN" mpc party --role 1 -m "$M" --listen $((port + 1)) --dealer "127.0.0.1:$port" \
  --peer-key "$TMP/peer.key" --dealer-key "$TMP/d1.key" --timeout 20 \
  >"$TMP/p1.out" 2>"$TMP/p1.err" &
p1_pid=$!; bg_pids+=("$p1_pid")
status=0
"$KVS_BIN" mpc party --role 0 -m "$M" -p "$P" -n 8 --peer "127.0.0.1:$((port + 1))" \
  --dealer "127.0.0.1:$port" --peer-key "$TMP/peer.key" --dealer-key "$TMP/d0.key" --timeout 20 \
  --json "$TMP/alone.json" >"$TMP/p0.out" 2>"$TMP/p0.err" || status=$?
s1=0; wait "$p1_pid" || s1=$?
sd=0; wait "$dealer_pid" || sd=$?
if [ "$status$s1$sd" = 000 ] && grep -q "^$P" "$TMP/p0.out" && grep -q "channels: AES-256-GCM" "$TMP/p0.out"; then
  pass "mpc dealer + party 1 + party 0 run to the end"
  if have_py; then
    python3 - "$TMP/enc.json" "$TMP/alone.json" >"$TMP/alone.cmp" 2>&1 <<'EOF' \
      && pass "the standalone roles generate mpc run's tokens: $(cat "$TMP/alone.cmp")" \
      || fail "standalone tokens: $(cat "$TMP/alone.cmp")"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
if a["tokens"] == b["tokens"]:
    print(a["tokens"])
    sys.exit(0)
print("NOTE: differ: run %s, standalone %s" % (a["tokens"], b["tokens"]))
sys.exit(0 if a["tokens"][:4] == b["tokens"][:4] else 1)
EOF
  fi
else
  fail "standalone roles: exits $status/$s1/$sd: $(head -c 300 "$TMP/p0.err") $(head -c 300 "$TMP/p1.err") $(head -c 300 "$TMP/dealer.err") / $(head -n 1 "$TMP/p0.out")"
fi

# ---- bad usage: exit 2 naming the flag ----
usage_fail() { # DESCRIPTION PATTERN CMD...: exit status 2 and PATTERN on stderr
  local what=$1 pattern=$2; shift 2
  local st=0
  "$@" >"$TMP/out" 2>"$TMP/err" || st=$?
  if [ "$st" = 2 ] && grep -q -- "$pattern" "$TMP/err"; then pass "$what: $(head -n 1 "$TMP/err")"
  else fail "$what: exit $st: $(head -c 300 "$TMP/err")"; fi
}
usage_fail "missing -m" "needs -m MODEL" "$KVS_BIN" mpc run -p "$P" -n 4
usage_fail "missing prompt" "one of -p TEXT or --tokens" "$KVS_BIN" mpc run -m "$M" -n 4
usage_fail "missing -n" "needs -n N" "$KVS_BIN" mpc run -m "$M" -p "$P"
usage_fail "negative -n" "\-n expects a whole number" "$KVS_BIN" mpc run -m "$M" -p "$P" -n -3
usage_fail "--frac 30" "\-\-frac expects a whole number in \[8, 24\]" "$KVS_BIN" mpc run -m "$M" -p "$P" -n 4 --frac 30
usage_fail "--frac 4" "\-\-frac expects a whole number in \[8, 24\]" "$KVS_BIN" mpc run -m "$M" -p "$P" -n 4 --frac 4
printf '1\n400\n300\n' >"$TMP/three.tokens"
usage_fail "--prompt-len beyond the tokens" "\-\-prompt-len 5 is larger than the 3 tokens" \
  "$KVS_BIN" mpc run -m "$M" --tokens "$TMP/three.tokens" --prompt-len 5 -n 2
usage_fail "unknown subcommand" "unknown subcommand 'walk'" "$KVS_BIN" mpc walk
usage_fail "unreadable key file" "\-\-key0 $TMP/nope.key" \
  "$KVS_BIN" mpc dealer --listen "$port" --key0 "$TMP/nope.key" --key1 "$TMP/d1.key"
echo "not a key" >"$TMP/bad.key"
usage_fail "malformed key file" "\-\-key1 $TMP/bad.key: a key file holds 64 hex digits" \
  "$KVS_BIN" mpc dealer --listen "$port" --key0 "$TMP/d0.key" --key1 "$TMP/bad.key"
usage_fail "party without --role" "needs --role" "$KVS_BIN" mpc party -m "$M" --insecure-plain
usage_fail "party without --dealer" "needs --dealer HOST:PORT" \
  "$KVS_BIN" mpc party --role 1 -m "$M" --listen "$port" --insecure-plain

# ---- failures at run time: exit 1 ----
status=0
"$KVS_BIN" mpc party --role 0 -m "$M" -p "$P" -n 2 --peer 127.0.0.1:1 --dealer 127.0.0.1:1 \
  --insecure-plain --timeout 1 >"$TMP/out" 2>"$TMP/err" || status=$?
[ "$status" = 1 ] && grep -q "cannot reach 127.0.0.1:1" "$TMP/err" \
  && pass "unreachable dealer: $(head -n 1 "$TMP/err")" \
  || fail "unreachable dealer: exit $status: $(head -c 300 "$TMP/err")"
"$KVS_BIN" mpc dealer --listen "$port" --insecure-plain --timeout 3 >/dev/null 2>&1 &
busy_pid=$!; bg_pids+=("$busy_pid")
sleep 0.3
status=0
"$KVS_BIN" mpc dealer --listen "$port" --insecure-plain --timeout 1 >"$TMP/out" 2>"$TMP/err" || status=$?
[ "$status" = 1 ] && grep -q "in use" "$TMP/err" && pass "port in use: $(head -n 1 "$TMP/err")" \
  || fail "port in use: exit $status: $(head -c 300 "$TMP/err")"
kill "$busy_pid" 2>/dev/null || true
wait "$busy_pid" 2>/dev/null || true

# A party killed mid-run: exit 1 within the timeout, naming it; nothing left running.
status=0
t0=$SECONDS
# The tag goes in the JSON path, not the prompt: a short prompt is one short prefill block, and
# the roles wait for each other's blocks within --timeout even under the sanitizers.
KVS_MPC_TEST_KILL=3 "$KVS_BIN" mpc run -m "$M" -p "$P" -n 8 --timeout 10 \
  --json "$TMP/$tag.json" >"$TMP/out" 2>"$TMP/err" || status=$?
if [ "$status" = 1 ] && grep -q "party 1 was killed by signal 9" "$TMP/err" && [ $((SECONDS - t0)) -le 20 ]; then
  pass "party 1 killed mid-run: $(grep -m 1 "party 1 was killed" "$TMP/err")"
else
  fail "party 1 killed: exit $status after $((SECONDS - t0)) s: $(head -c 500 "$TMP/err")"
fi
grep -q "[0-9a-f]\{32\}" "$TMP/err" && fail "an error shows 32 hex digits (a key?)" \
  || pass "no key-like bytes in the errors"
pgrep -f "$tag" >/dev/null && fail "processes left: $(pgrep -af "$tag")" || pass "no role left running"

# The parent killed by SIGKILL: its children die with it.
timeout -s KILL 2 "$KVS_BIN" mpc run -m "$M" -p "$P $tag-orphan" -n 200 >/dev/null 2>&1 || true
sleep 0.5
pgrep -f "$tag-orphan" >/dev/null && fail "orphans left: $(pgrep -af "$tag-orphan")" \
  || pass "no orphan after the parent is killed"

finish
