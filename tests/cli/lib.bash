# Shared setup for the CLI tests (sourced). ctest sets KVS_BIN, KVS_SHARED_DIR, KVS_TEST_TMP.
set -euo pipefail
: "${KVS_BIN:?run through ctest}" "${KVS_SHARED_DIR:?}" "${KVS_TEST_TMP:?}"
MODELS=$KVS_SHARED_DIR/models
GOLDEN=$MODELS/golden
COMPARE=${KVS_logits_compare:-}
TMP=$(mktemp -d "$KVS_TEST_TMP/$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0
passes=0

pass() { passes=$((passes + 1)); echo "ok: $*"; }
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }

# expect_fail DESCRIPTION PATTERN CMD...: CMD must exit non-zero and print PATTERN on stderr.
expect_fail() {
  local what=$1 pattern=$2; shift 2
  local status=0
  "$@" >"$TMP/out" 2>"$TMP/err" || status=$?
  if [ "$status" -eq 0 ]; then
    fail "$what: exited 0"
  elif [ "$status" -gt 2 ]; then
    fail "$what: exit status $status (crash?): $(head -c 400 "$TMP/err")"
  elif ! grep -q -- "$pattern" "$TMP/err"; then
    fail "$what: stderr lacks '$pattern': $(head -c 400 "$TMP/err")"
  else
    pass "$what: $(head -n 1 "$TMP/err")"
  fi
}

finish() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}

# convert_model TYPE OUT: our own GGUF from the llama2.c checkpoint.
convert_model() {
  "$KVS_BIN" convert "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.bin" -o "$2" \
    --type "$1" 2>/dev/null
}

# free_ports N: sets $port to a base P such that P .. P+N-1 lie below the kernel's ephemeral
# range (where no outgoing connection of this or a concurrent test is given a port; a random
# port inside it once collided with one, "Address already in use") and nothing listens on
# any of them now. Two concurrent tests could still draw the same base; the check narrows that.
free_ports() {
  local n=$1 lo=32768 try i busy
  [ -r /proc/sys/net/ipv4/ip_local_port_range ] && read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
  [ "$lo" -gt 11024 ] || lo=32768 # a range starting low: use ports the default range leaves free
  for try in $(seq 1 50); do
    port=$((10000 + RANDOM % (lo - 10000 - n)))
    busy=0
    for ((i = 0; i < n; i++)); do
      # a connection accepted means a listener: that port is taken
      if (exec 3<>"/dev/tcp/127.0.0.1/$((port + i))") 2>/dev/null; then busy=1; break; fi
    done
    [ "$busy" -eq 0 ] && return 0
  done
  echo "free_ports: no $n free ports below $lo after 50 tries" >&2
  return 1
}
