#!/usr/bin/env bash
# Files claiming huge sizes fail fast, under a 1 GiB address-space limit, with exit status 1 and
# a message naming the file and the field; absurd size flags exit 2. The crafted files are
# copies of the reference model with fields overwritten (tests/cli/gguf_patch.py): tiny on
# disk, or sparse where the file size itself must look plausible so that kvslim's own limits
# (core/limits.h, gguf/gguf.h) are what stops them.
source "$(dirname "$0")/lib.bash"
GGUF=$MODELS/gguf/stories260K-f32.gguf
PATCH=$(dirname "$0")/gguf_patch.py
# ASan reserves terabytes of address space, so a sanitized kvslim cannot run under ulimit -v;
# it still runs every check, without the limit.
limit="ulimit -v 1048576;"
grep -q __asan_init "$KVS_BIN" && limit=""

# limited DESC PATTERN CMD...: CMD, under the limit and a 20 s timeout, exits 1 within 5 s
# with PATTERN on stderr.
limited() {
  local what=$1 pattern=$2; shift 2
  local status=0 start end
  start=$(date +%s%N)
  bash -c "$limit exec timeout 20 \"\$@\"" limited "$@" >"$TMP/out" 2>"$TMP/err" || status=$?
  end=$(date +%s%N)
  local ms=$(( (end - start) / 1000000 ))
  if [ "$status" -ne 1 ]; then
    fail "$what: exit status $status, expected 1: $(head -c 400 "$TMP/err")"
  elif ! grep -q -- "$pattern" "$TMP/err"; then
    fail "$what: stderr lacks '$pattern': $(head -c 400 "$TMP/err")"
  elif [ "$ms" -gt 5000 ]; then
    fail "$what: took $ms ms"
  else
    pass "$what ($ms ms): $(head -n 1 "$TMP/err")"
  fi
}

# The crafted files, $TMP/NAME.gguf (see gguf_patch.py).
python3 "$PATCH" "$GGUF" "$TMP" <<EOF
huge-tensor tensor:token_embd.weight.dim0=$((1 << 20)) tensor:token_embd.weight.dim1=$((1 << 20))
overflow-tensor tensor:token_embd.weight.dim0=$((1 << 40)) tensor:token_embd.weight.dim1=$((1 << 40))
vocab key:tokenizer.ggml.tokens=$((1 << 31))
vocab-sparse key:tokenizer.ggml.tokens=$((1 << 25)) size=$((300 << 20))
ctx-$((1 << 31)) key:llama.context_length=$((1 << 31))
ctx-$((1 << 24 | 1)) key:llama.context_length=$((1 << 24 | 1))
ctx-$((1 << 24)) key:llama.context_length=$((1 << 24))
long-string key:general.architecture=$((1 << 40))
long-token key:tokenizer.ggml.tokens[0]=$((1 << 40)) size=$((300 << 20))
tensors header.tensors=$((1 << 40))
keys header.keys=$((1 << 40))
tensors-sparse header.tensors=$((1 << 21)) size=$((300 << 20))
keys-sparse header.keys=$((1 << 21)) size=$((300 << 20))
llama.embedding_length key:llama.embedding_length=$((1 << 31))
llama.feed_forward_length key:llama.feed_forward_length=$(((1 << 32) - 1))
llama.block_count key:llama.block_count=$((1 << 30))
llama.attention.head_count key:llama.attention.head_count=$((1 << 21))
layers key:llama.block_count=65536
EOF

# (a) a tensor of 2^40 elements
limited "tensor of 2^40 elements" \
  "huge-tensor.gguf: tensor 'token_embd.weight': data \[offset 0, 4398046511104 bytes\] extends past end of file" \
  "$KVS_BIN" run -m "$TMP/huge-tensor.gguf" -p hi -n 2
limited "tensor of 2^80 elements" "tensor 'token_embd.weight': element count overflows" \
  "$KVS_BIN" run -m "$TMP/overflow-tensor.gguf" -p hi -n 2

# (b) a vocabulary of 2^31 tokens: in a small file, and in a sparse 300 MiB one of 2^25 empty
# strings, which the file size allows
limited "vocabulary of 2^31 tokens" \
  "vocab.gguf: metadata key #0 ('tokenizer.ggml.tokens'): array length 2147483648 of string elements" \
  "$KVS_BIN" tokenize -m "$TMP/vocab.gguf" -p hi
limited "vocabulary of 2^25 tokens (sparse file)" \
  "('tokenizer.ggml.tokens'): array length 33554432 of string elements exceeds kvslim's limit of 16777216" \
  "$KVS_BIN" run -m "$TMP/vocab-sparse.gguf" -p hi -n 2

# (c) context lengths: 2^31 and 2^24 + 1 are refused at load; 2^24 (the limit) runs, with a
# KV cache that grows with the tokens, not with the context
for ctx in $((1 << 31)) $((1 << 24 | 1)); do
  limited "context_length $ctx" \
    "ctx-$ctx.gguf: metadata key 'llama.context_length' is $ctx; kvslim supports at most 16777216" \
    "$KVS_BIN" run -m "$TMP/ctx-$ctx.gguf" -p hi -n 2
done
status=0
bash -c "$limit exec timeout 20 \"\$@\"" run "$KVS_BIN" run -m "$TMP/ctx-$((1 << 24)).gguf" -p "Once upon" \
  -n 8 --temp 0 >"$TMP/out" 2>"$TMP/err" || status=$?
if [ "$status" -eq 0 ] && grep -q "generated 8 tokens" "$TMP/err"; then
  pass "context_length 16777216 runs: $(tail -n 1 "$TMP/err")"
else
  fail "context_length 16777216: status $status: $(head -c 400 "$TMP/err")"
fi

# (d) strings of 2^40 bytes: a metadata value and a token of the vocabulary (in a sparse file)
limited "string of 2^40 bytes" \
  "long-string.gguf: metadata key #4 ('general.architecture'): string length 1099511627776 exceeds file size" \
  "$KVS_BIN" run -m "$TMP/long-string.gguf" -p hi -n 2
limited "token of 2^40 bytes" "('tokenizer.ggml.tokens'): string element #0 length 1099511627776 exceeds file size" \
  "$KVS_BIN" run -m "$TMP/long-token.gguf" -p hi -n 2

# (e) tensor and key counts of 2^40, and of 2^21 in sparse files that could hold them
limited "tensor count 2^40" "tensors.gguf: tensor count 1099511627776 exceeds what the file could hold" \
  "$KVS_BIN" run -m "$TMP/tensors.gguf" -p hi -n 2
limited "key count 2^40" "keys.gguf: metadata count 1099511627776 exceeds what the file could hold" \
  "$KVS_BIN" run -m "$TMP/keys.gguf" -p hi -n 2
limited "tensor count 2^21 (sparse file)" \
  "tensors-sparse.gguf: tensor count 2097152 exceeds kvslim's limit of 1048576 tensors" \
  "$KVS_BIN" run -m "$TMP/tensors-sparse.gguf" -p hi -n 2
limited "key count 2^21 (sparse file)" \
  "keys-sparse.gguf: metadata count 2097152 exceeds kvslim's limit of 1048576 keys" \
  "$KVS_BIN" run -m "$TMP/keys-sparse.gguf" -p hi -n 2

# (f) widths and depths
for kv in embedding_length=$((1 << 31)) feed_forward_length=$(((1 << 32) - 1)) \
          block_count=$((1 << 30)) attention.head_count=$((1 << 21)); do
  key=llama.${kv%=*} v=${kv#*=}
  limited "$key = $v" "$key.gguf: metadata key '$key' is $v; kvslim supports at most" \
    "$KVS_BIN" run -m "$TMP/$key.gguf" -p hi -n 2
done
limited "block_count 65536 (within the limit, beyond the file)" \
  "layers.gguf: llama.block_count 65536 and embedding_length 64 (64 query dims) need more weights than the file's 292800 tensor elements" \
  "$KVS_BIN" run -m "$TMP/layers.gguf" -p hi -n 2

# llama2.c checkpoints whose header claims huge shapes
ckpt=$MODELS/stories260K.bin
# header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len (int32 each)
header() {
  local v
  for v in "$@"; do
    v=$((v & 0xffffffff))
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $((v >> 8 & 255)) \
      $((v >> 16 & 255)) $((v >> 24)))"
  done
}
{ header 64 172 16777216 8 4 512 512; tail -c +29 "$ckpt"; } >"$TMP/layers.bin"
limited "checkpoint with 2^24 layers" "layers.bin: header field n_layers = 16777216 is out of range (1..65536)" \
  "$KVS_BIN" convert "$TMP/layers.bin" --tokenizer "$MODELS/tok512.bin" -o "$TMP/out.gguf"
{ header 1048576 1048576 65536 8 8 16777216 16777216; tail -c +29 "$ckpt"; } >"$TMP/shape.bin"
limited "checkpoint claiming 2^20-wide layers" \
  "shape.bin: truncated checkpoint: header (dim 1048576, hidden_dim 1048576, n_layers 65536" \
  "$KVS_BIN" convert "$TMP/shape.bin" --tokenizer "$MODELS/tok512.bin" -o "$TMP/out.gguf"
{ header 64 172 5 8 4 -2147483647 512; tail -c +29 "$ckpt"; } >"$TMP/vocab.bin"
limited "checkpoint with vocab_size -(2^31 - 1)" "vocab.bin: header field vocab_size = -2147483647 is out of range" \
  "$KVS_BIN" convert "$TMP/vocab.bin" --tokenizer "$MODELS/tok512.bin" -o "$TMP/out.gguf"
[ ! -e "$TMP/out.gguf" ] && pass "no GGUF left behind" || fail "partial GGUF written"
# a llama2.c tokenizer whose max_token_length and first token claim 2^31 - 1 bytes
{ printf '\xff\xff\xff\x7f'; printf '\x00\x00\x00\x00\xff\xff\xff\x7f'; } >"$TMP/tok.bin"
truncate -s $((300 << 20)) "$TMP/tok.bin"
limited "tokenizer token of 2^31 - 1 bytes (sparse file)" "tok.bin: token 0: byte length 2147483647 at offset 8 exceeds kvslim's limits" \
  "$KVS_BIN" convert "$ckpt" --tokenizer "$TMP/tok.bin" -o "$TMP/out.gguf"

# absurd size flags: exit 2 with a message naming the flag
expect_usage() {
  local what=$1 pattern=$2; shift 2
  local status=0
  "$@" >"$TMP/out" 2>"$TMP/err" || status=$?
  if [ "$status" -eq 2 ] && grep -q -- "$pattern" "$TMP/err"; then
    pass "$what: $(head -n 1 "$TMP/err")"
  else
    fail "$what: status $status: $(head -c 400 "$TMP/err")"
  fi
}
expect_usage "run -n 2^40" "-n expects a whole number in \[0, 16777216\], got '1099511627776'" \
  "$KVS_BIN" run -m "$GGUF" -p hi -n $((1 << 40))
expect_usage "run -c 2^24 + 1" "-c expects a whole number in \[1, 16777216\], got '16777217'" \
  "$KVS_BIN" run -m "$GGUF" -p hi -c $((1 << 24 | 1))
expect_usage "run -c 2^64" "-c expects a whole number" \
  "$KVS_BIN" run -m "$GGUF" -p hi -c 18446744073709551616
expect_usage "run --chunk 2^31" "--chunk expects a whole number" \
  "$KVS_BIN" run -m "$GGUF" -p hi --chunk $((1 << 31))
expect_usage "bench -p 2^31" "-p expects a whole number" \
  "$KVS_BIN" bench -m "$GGUF" -p $((1 << 31))
expect_usage "eval --prompt-len 2^31" "--prompt-len expects a whole number" \
  "$KVS_BIN" eval -m "$GGUF" --prompt-len $((1 << 31))
truncate -s $((65 << 20)) "$TMP/prompt.txt"
limited "run -f of 65 MiB (sparse file)" \
  "prompt.txt: 68157440 bytes is more than the 67108864 bytes (64 MiB)" \
  "$KVS_BIN" run -m "$GGUF" -f "$TMP/prompt.txt"
finish
