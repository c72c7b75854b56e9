#!/usr/bin/env bash
# Writing K-quant weights: bench --synthetic ...,type=q4_k_m|q5_k_m|q6_k|q4_k|q5_k --save
# makes a GGUF whose matrix types follow llama.cpp's mix rules (read back with an independent
# GGUF reader when python3 is there) and which bench -m loads and runs; convert --type takes
# the same names and falls back (with a note per tensor) where rows are not 256-element
# super-blocks; unknown type names are refused listing the accepted ones.
source "$(dirname "$0")/lib.bash"
SHAPE=dim=256,hidden=512,layers=8,heads=4,kv_heads=2,vocab=300,ctx=128

# gguf_types FILE: "name type-id" per tensor, from the file's header (GGUF v2/v3).
gguf_types() {
  python3 - "$1" <<'EOF'
import struct, sys
f = open(sys.argv[1], 'rb')
def rd(fmt):
    return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))[0]
def rstr():
    return f.read(rd('Q')).decode()
size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    if t == 8:
        rstr()
    elif t == 9:
        et, n = rd('I'), rd('Q')
        for _ in range(n):
            skip(et)
    else:
        f.read(size[t])
assert f.read(4) == b'GGUF'
rd('I')
n_tensors, n_kv = rd('Q'), rd('Q')
kv = {}
for _ in range(n_kv):
    k, t = rstr(), rd('I')
    if k == 'general.file_type':
        kv[k] = rd('I')
    else:
        skip(t)
print('file_type', kv.get('general.file_type', -1))
for _ in range(n_tensors):
    name = rstr()
    nd = rd('I')
    for _ in range(nd):
        rd('Q')
    t = rd('I')
    rd('Q')
    print(name, t)
EOF
}

# expected_type MIX NAME: the GGML type id llama.cpp's rules give NAME in an 8-layer model
# (use_more_bits holds for layers 0, 3, 6 and 7). Q4_K 12, Q5_K 13, Q6_K 14, F32 0.
expected_type() {
  local mix=$1 name=$2 base
  case $mix in q4_k*) base=12 ;; q5_k*) base=13 ;; q6_k) base=14 ;; esac
  case $name in *_norm.weight) echo 0; return ;; esac
  case $mix in *_m) ;; *) echo "$base"; return ;; esac
  case $name in
    output.weight) echo 14 ;;
    blk.[0367].attn_v.weight | blk.[0367].ffn_down.weight) echo 14 ;;
    *) echo "$base" ;;
  esac
}

have_py=0
command -v python3 >/dev/null && have_py=1
for mix in q4_k_m q5_k_m q6_k q4_k q5_k; do
  out=$TMP/$mix.gguf
  if ! "$KVS_BIN" bench --synthetic "$SHAPE,type=$mix" -p 8 -n 2 -t 2 --save "$out" \
      >"$TMP/table" 2>"$TMP/err"; then
    fail "$mix: bench --save failed: $(head -c 400 "$TMP/err")"
    continue
  fi
  [ -s "$out" ] && pass "$mix: bench --synthetic ...,type=$mix --save wrote $(stat -c %s "$out") bytes" \
    || fail "$mix: no file"
  # Loaded back and run: the table names the attention weights' type.
  if "$KVS_BIN" bench -m "$out" -p 8 -n 2 -t 2 >"$TMP/table2" 2>"$TMP/err" &&
      grep -q "| q[456]_K " "$TMP/table2"; then
    pass "$mix: bench -m on the saved file"
  else
    fail "$mix: bench -m: $(head -c 400 "$TMP/err") $(tail -n 1 "$TMP/table2")"
  fi
  [ "$have_py" = 1 ] || continue
  gguf_types "$out" >"$TMP/types"
  bad=0 n=0
  while read -r name t; do
    if [ "$name" = file_type ]; then
      case $mix in q4_k_m) want=15 ;; q5_k_m) want=17 ;; q6_k) want=18 ;; q4_k) want=14 ;; q5_k) want=16 ;; esac
    else
      want=$(expected_type "$mix" "$name")
    fi
    n=$((n + 1))
    [ "$t" = "$want" ] || { bad=$((bad + 1)); echo "  $mix: $name is type $t, expected $want"; }
  done <"$TMP/types"
  [ "$bad" -eq 0 ] && [ "$n" -gt 70 ] && pass "$mix: $n tensor types and file_type as llama.cpp's rules" \
    || fail "$mix: $bad of $n tensor types wrong"
done

# Unknown names: refused before any work, listing the accepted types (exit 2).
expect_fail "bench unknown type" \
  "--synthetic type: unknown type 'q4_k_l' (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)" \
  "$KVS_BIN" bench --synthetic "$SHAPE,type=q4_k_l" -p 4 -n 1 --save "$TMP/never.gguf"
[ ! -e "$TMP/never.gguf" ] && pass "nothing written for a bad type" || fail "bad type wrote a file"
expect_fail "bench read-only type" "unknown type 'q3_k'" \
  "$KVS_BIN" bench --synthetic "$SHAPE,type=q3_k" -p 4 -n 1
expect_fail "convert unknown type" "--type: unknown type 'q6_k_m'" \
  "$KVS_BIN" convert "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.bin" \
  -o "$TMP/c.gguf" --type q6_k_m

# convert --type q4_k_m on stories260K (rows of 64 and 172): no matrix can be a K-quant, so
# each falls back (Q8_0, or F16 for rows of 172) with a note naming it, and the model runs.
if "$KVS_BIN" convert "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.bin" \
    -o "$TMP/c.gguf" --type q4_k_m 2>"$TMP/err"; then
  grep -q "note: blk.0.attn_q.weight has rows of 64, not a multiple of the q4_K block size 256; stored as q8_0" "$TMP/err" &&
    grep -q "note: blk.4.ffn_down.weight has rows of 172, not a multiple of the q6_K block size 256; stored as f16" "$TMP/err" &&
    grep -q "wrote .* (q4_k_m)" "$TMP/err" && pass "convert q4_k_m: fallbacks noted" \
    || fail "convert q4_k_m notes: $(head -c 600 "$TMP/err")"
  "$KVS_BIN" run -m "$TMP/c.gguf" -p "Once upon a time" -n 8 >"$TMP/run" 2>"$TMP/err" &&
    grep -q "Once upon a time" "$TMP/run" && pass "converted q4_k_m model runs" \
    || fail "run: $(head -c 400 "$TMP/err")"
else
  fail "convert --type q4_k_m: $(head -c 400 "$TMP/err")"
fi
finish
