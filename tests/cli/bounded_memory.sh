#!/usr/bin/env bash
# Evicting policies bound the KV cache on a prompt much longer than their budget: peak KV bytes
# stay within (budget + chunk) x bytes per token, while the full cache grows with the prompt.
source "$(dirname "$0")/lib.bash"
shape=dim=64,hidden=128,layers=2,heads=4,kv_heads=2,vocab=300,ctx=8192
# bytes per token: layers x KV heads x (key + value fp32 of head_dim 16, position, metadata)
per_token() { echo $((2 * 2 * (2 * 16 * 4 + 4 + 4 * $1))); }
check() { # policy n_meta budget
  "$KVS_BIN" bench --synthetic "$shape" -p 4096 -n 16 --chunk 256 -t 2 --kv-type f32 --kv "$1:slots=$3" \
    --json "$TMP/b.json" >/dev/null
  peak=$(sed 's/.*"kv_bytes_peak": \([0-9]*\).*/\1/' "$TMP/b.json")
  limit=$(( ($3 + 256) * $(per_token "$2") ))
  if [ "$peak" -le "$limit" ]; then pass "$1 budget $3: peak KV $peak <= $limit bytes"
  else fail "$1 budget $3: peak KV $peak > $limit bytes"; fi
}
check streaming 0 256
if "$KVS_BIN" run --kv help | grep '^h2o' >/dev/null; then check h2o 1 256; fi
"$KVS_BIN" bench --synthetic "$shape" -p 4096 -n 16 --chunk 256 -t 2 --kv-type f32 --json "$TMP/full.json" >/dev/null
peak=$(sed 's/.*"kv_bytes_peak": \([0-9]*\).*/\1/' "$TMP/full.json")
[ "$peak" -ge $(( 4096 * $(per_token 0) )) ] && pass "full: peak KV $peak bytes grows with the prompt" \
  || fail "full: peak KV $peak bytes"
finish
