#!/usr/bin/env bash
# Every file the CLI reads or writes for the user (issue 7, defects 2, 3, 6, 7, 8, 11):
# outputs are written through FIFOs and devices (never replaced), into a symlink's target (the
# link stays), refused when they are a directory or one of the command's inputs, created with
# the umask's mode, checked before any work, and cleaned up on Ctrl-C; prompt and token files
# are bounded, typed and free of NUL bytes.
source "$(dirname "$0")/lib.bash"
GGUF=$MODELS/gguf/stories260K-f32.gguf
CKPT=$MODELS/stories260K.bin
TOK=$MODELS/tok512.bin
head -n 40 "$GOLDEN/stories260K-greedy-512.tokens" >"$TMP/t.tokens"
SHAPE=dim=32,hidden=64,layers=1,heads=2,kv_heads=2,vocab=300,ctx=64

# One function per writer: w_NAME OUT runs the command so that it writes OUT.
w_eval_json() { "$KVS_BIN" eval -m "$GGUF" --tokens "$TMP/t.tokens" --prompt-len 30 --kv full -t 1 --json "$1"; }
w_eval_csv() { "$KVS_BIN" eval -m "$GGUF" --tokens "$TMP/t.tokens" --prompt-len 30 --kv full -t 1 --csv "$1"; }
w_eval_plot() { "$KVS_BIN" eval -m "$GGUF" --tokens "$TMP/t.tokens" --prompt-len 30 --kv full -t 1 --plot "$1"; }
w_logits() { "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/t.tokens" -t 1 --out "$1"; }
w_bench_json() { "$KVS_BIN" bench --synthetic "$SHAPE" -p 8 -n 2 -t 1 --json "$1"; }
w_bench_save() { "$KVS_BIN" bench --synthetic "$SHAPE" -p 8 -n 2 -t 1 --save "$1"; }
w_convert() { "$KVS_BIN" convert "$CKPT" --tokenizer "$TOK" -o "$1"; }
writers="eval_json eval_csv logits bench_json bench_save convert"
command -v gnuplot >/dev/null && writers="$writers eval_plot"

for w in $writers; do
  # A FIFO destination is written through (a reader gets the bytes) and stays a FIFO.
  rm -f "$TMP/fifo" "$TMP/fifo.out"
  mkfifo "$TMP/fifo"
  timeout 60 cat "$TMP/fifo" >"$TMP/fifo.out" &
  reader=$!
  status=0
  "w_$w" "$TMP/fifo" >/dev/null 2>"$TMP/err" || status=$?
  if [ "$status" -eq 0 ] && [ -p "$TMP/fifo" ]; then
    wait "$reader" || true
  else
    kill "$reader" 2>/dev/null || true # nobody may ever open the FIFO for writing
    wait "$reader" 2>/dev/null || true
  fi
  fifo_ok=0
  if [ "$status" -ne 0 ]; then
    fail "$w into a FIFO: exit $status: $(head -c 300 "$TMP/err")"
  elif [ ! -p "$TMP/fifo" ]; then
    fail "$w into a FIFO: the FIFO was replaced by a $(stat -c %F "$TMP/fifo")"
  elif [ ! -s "$TMP/fifo.out" ]; then
    fail "$w into a FIFO: the reader got nothing"
  else
    fifo_ok=1
    pass "$w into a FIFO: $(stat -c %s "$TMP/fifo.out") bytes through, still a FIFO"
  fi

  # /dev/null: only once writing through a FIFO works, since the unfixed code (run as root)
  # would replace the machine's /dev/null. It must stay the same character device.
  if [ "$fifo_ok" = 1 ]; then
    before=$(stat -c '%F %t:%T %i' /dev/null)
    status=0
    "w_$w" /dev/null >/dev/null 2>"$TMP/err" || status=$?
    after=$(stat -c '%F %t:%T %i' /dev/null)
    [ "$status" -eq 0 ] && [ "$before" = "$after" ] && [ -c /dev/null ] \
      && pass "$w into /dev/null: still '$after'" \
      || fail "$w into /dev/null: exit $status, '$before' -> '$after': $(head -c 300 "$TMP/err")"
  fi

  # A symlink destination: the target is replaced, the link stays a link.
  echo old >"$TMP/target.$w"
  ln -sf "target.$w" "$TMP/link.$w"
  status=0
  "w_$w" "$TMP/link.$w" >/dev/null 2>"$TMP/err" || status=$?
  if [ "$status" -eq 0 ] && [ -L "$TMP/link.$w" ] && [ -f "$TMP/target.$w" ] \
    && [ "$(cat "$TMP/target.$w")" != old ] && [ -s "$TMP/target.$w" ]; then
    pass "$w into a symlink: link kept, target written"
  else
    fail "$w into a symlink: exit $status, link is a $(stat -c %F "$TMP/link.$w"), target $(head -c 20 "$TMP/target.$w" | tr -dc '[:print:]')"
  fi

  # A directory destination is refused before any work, and stays a directory.
  mkdir -p "$TMP/dir.$w"
  expect_fail "$w into a directory" "is a directory" "w_$w" "$TMP/dir.$w"
  [ -d "$TMP/dir.$w" ] && [ -z "$(ls -A "$TMP/dir.$w")" ] || fail "$w: directory changed"

  # Mode from the umask.
  for u in 022 077; do
    status=0
    (umask $u && "w_$w" "$TMP/mode$u.$w") >/dev/null 2>"$TMP/err" || status=$?
    want=$(printf '%o' $((0666 & ~0$u)))
    got=$(stat -c %a "$TMP/mode$u.$w" 2>/dev/null || echo none)
    [ "$status" -eq 0 ] && [ "$got" = "$want" ] && pass "$w under umask $u: mode $got" \
      || fail "$w under umask $u: exit $status, mode $got, want $want"
  done
done
! ls "$TMP" | grep -q '\.tmp\.' && pass "no temporary files left" \
  || fail "temporary files left: $(ls "$TMP" | grep '\.tmp\.' | head -3)"

# Writing onto one of the command's own inputs is refused; the input is unchanged.
cp "$CKPT" "$TMP/ck.bin"
cp "$TOK" "$TMP/tok.bin"
cp "$GGUF" "$TMP/m.gguf"
cp "$TMP/t.tokens" "$TMP/in.tokens"
ln -sf ck.bin "$TMP/ck-link.bin"
sums() { md5sum "$TMP/ck.bin" "$TMP/tok.bin" "$TMP/m.gguf" "$TMP/in.tokens" | cut -d' ' -f1 | tr '\n' ' '; }
before=$(sums)
expect_fail "convert -o its checkpoint" "same file" \
  "$KVS_BIN" convert "$TMP/ck.bin" --tokenizer "$TMP/tok.bin" -o "$TMP/ck.bin"
expect_fail "convert -o its tokenizer" "same file" \
  "$KVS_BIN" convert "$TMP/ck.bin" --tokenizer "$TMP/tok.bin" -o "$TMP/tok.bin"
expect_fail "convert -o a link to its checkpoint" "same file" \
  "$KVS_BIN" convert "$TMP/ck.bin" --tokenizer "$TMP/tok.bin" -o "$TMP/ck-link.bin"
expect_fail "logits --out its model" "same file" \
  "$KVS_BIN" logits -m "$TMP/m.gguf" --tokens "$TMP/in.tokens" --out "$TMP/m.gguf"
expect_fail "logits --out its token file" "same file" \
  "$KVS_BIN" logits -m "$TMP/m.gguf" --tokens "$TMP/in.tokens" --out "$TMP/in.tokens"
expect_fail "eval --json its token file" "same file" "$KVS_BIN" eval -m "$TMP/m.gguf" \
  --tokens "$TMP/in.tokens" --prompt-len 30 --kv full --json "$TMP/in.tokens"
expect_fail "eval --csv its model" "same file" "$KVS_BIN" eval -m "$TMP/m.gguf" \
  --tokens "$TMP/in.tokens" --prompt-len 30 --kv full --csv "$TMP/m.gguf"
expect_fail "bench --json its model" "same file" \
  "$KVS_BIN" bench -m "$TMP/m.gguf" -p 8 -n 2 -t 1 --json "$TMP/m.gguf"
[ "$(sums)" = "$before" ] && [ -L "$TMP/ck-link.bin" ] && pass "inputs unchanged" \
  || fail "an input was overwritten"

# Outputs are checked before the work: a missing model would be the first error otherwise.
mkdir -p "$TMP/outdir"
expect_fail "logits --out DIR/ before loading" "--out.*is a directory" \
  "$KVS_BIN" logits -m "$TMP/nope.gguf" --tokens "$TMP/t.tokens" --out "$TMP/outdir/"
expect_fail "eval --json DIR before loading" "--json.*is a directory" "$KVS_BIN" eval \
  -m "$TMP/nope.gguf" --tokens "$TMP/t.tokens" --prompt-len 30 --kv full --json "$TMP/outdir"
expect_fail "eval --csv in a missing directory before loading" "--csv.*does not exist" \
  "$KVS_BIN" eval -m "$TMP/nope.gguf" --tokens "$TMP/t.tokens" --prompt-len 30 --kv full \
  --csv /nonexistent/dir/x.csv
expect_fail "bench --json DIR before loading" "--json.*is a directory" \
  "$KVS_BIN" bench -m "$TMP/nope.gguf" --json "$TMP/outdir"
expect_fail "convert -o in a missing directory before reading" "-o.*does not exist" \
  "$KVS_BIN" convert "$TMP/nope.bin" --tokenizer "$TOK" -o "$TMP/no/such/x.gguf"
# bench --save DIR fails before generating a model that would take seconds to build.
start=$(date +%s%N)
expect_fail "bench --save DIR before generating" "--save.*is a directory" "$KVS_BIN" bench \
  --synthetic dim=2048,hidden=5632,layers=4,heads=16,vocab=32000 -p 8 -n 1 --save "$TMP/outdir"
ms=$((($(date +%s%N) - start) / 1000000))
[ "$ms" -lt 1500 ] && pass "bench --save DIR failed in $ms ms" || fail "bench --save DIR took $ms ms"

# Inputs: no devices or directories, a bound on size (also while reading a pipe), no NUL bytes.
guard=""
grep -q __asan_init "$KVS_BIN" || guard="ulimit -v 4000000;" # the unfixed code reads /dev/zero forever
for c in "logits -m $GGUF --out $TMP/x --tokens" \
  "eval -m $GGUF --prompt-len 2 --kv full --tokens" "run -m $GGUF -n 1 -f" "tokenize -m $GGUF -f"; do
  name=${c%% *}
  expect_fail "$name reading /dev/zero" "character device" bash -c "$guard timeout 10 $KVS_BIN $c /dev/zero"
  expect_fail "$name reading a directory" "is a directory" bash -c "$guard timeout 10 $KVS_BIN $c $TMP/outdir"
done
{ yes "Once upon a time there was a little girl." || true; } | head -c 70000000 >"$TMP/big.txt"
expect_fail "run with a 70 MB prompt file" "64 MiB" timeout 20 "$KVS_BIN" run -m "$GGUF" -n 1 -f "$TMP/big.txt"
expect_fail "tokenize a 70 MB stream" "64 MiB" \
  bash -c "yes 'Once upon a time' | head -c 70000000 | timeout 20 $KVS_BIN tokenize -m $GGUF -f /dev/stdin"
{ yes 5 || true; } | head -c 70000000 >"$TMP/big.tokens"
expect_fail "logits with a 70 MB token file" "64 MiB" \
  timeout 20 "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/big.tokens" --out "$TMP/x"
printf 'Once upon\0 a time' >"$TMP/nul.txt"
expect_fail "run with a NUL in the prompt" "nul.txt:1: NUL byte at byte offset 9" \
  "$KVS_BIN" run -m "$GGUF" -n 1 -f "$TMP/nul.txt"
expect_fail "tokenize with a NUL in the prompt" "nul.txt:1: NUL byte" \
  "$KVS_BIN" tokenize -m "$GGUF" -f "$TMP/nul.txt"
printf '1\n403\n\0007\n9\n11\n' >"$TMP/nul.tokens"
expect_fail "logits with a NUL in the token file" "nul.tokens:3: NUL byte at byte offset 6" \
  "$KVS_BIN" logits -m "$GGUF" --tokens "$TMP/nul.tokens" --out "$TMP/x"
expect_fail "eval with a NUL in the token file" "nul.tokens:3: NUL byte" \
  "$KVS_BIN" eval -m "$GGUF" --tokens "$TMP/nul.tokens" --prompt-len 2 --kv full
# A prompt from a pipe within the bound still works.
echo "Once upon a time" | "$KVS_BIN" tokenize -m "$GGUF" -f /dev/stdin >"$TMP/ids" 2>"$TMP/err" \
  && [ -s "$TMP/ids" ] && pass "prompt from a pipe" || fail "prompt from a pipe: $(head -c 300 "$TMP/err")"

# "-" is standard output for results, standard input for token and prompt files.
out=$("$KVS_BIN" bench --synthetic "$SHAPE" -p 8 -n 2 -t 1 --json - 2>"$TMP/err" | tail -n 1)
case $out in '{"model": '*) pass "bench --json -: JSON on stdout" ;;
  *) fail "bench --json -: '$out' $(head -c 300 "$TMP/err")" ;; esac
"$KVS_BIN" logits -m "$GGUF" --tokens - --out "$TMP/stdin.f32" <"$TMP/t.tokens" 2>"$TMP/err" \
  && [ "$(stat -c %s "$TMP/stdin.f32")" = $((40 * 512 * 4)) ] && pass "logits --tokens -" \
  || fail "logits --tokens -: $(head -c 300 "$TMP/err")"

# Ctrl-C (or SIGTERM) while a large GGUF is being written removes the temporary file.
# Job control (set -m) keeps SIGINT at its default in the background job: a non-interactive
# shell would otherwise start it with SIGINT ignored.
big=dim=1024,hidden=2816,layers=2,heads=16,vocab=16000
interrupt_write() { # SIGNAL
  rm -rf "$TMP/sig" && mkdir -p "$TMP/sig"
  set -m
  "$KVS_BIN" bench --synthetic "$big" -p 4 -n 1 -t 1 --save "$TMP/sig/model.gguf" >/dev/null 2>&1 &
  local pid=$! seen=0 status=0
  set +m
  for _ in $(seq 1 3000); do # up to 30 s for the write to start
    if ls "$TMP/sig" | grep -q '\.tmp\.'; then seen=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  if [ "$seen" = 1 ]; then
    kill -"$1" "$pid"
    wait "$pid" || status=$?
    # Only a temporary file is a defect: if the write won the race, the finished model stays.
    local left
    left=$(ls "$TMP/sig" | grep '\.tmp\.' || true)
    [ "$status" -ne 0 ] && [ -z "$left" ] \
      && pass "SIG$1 during the GGUF write: exit $status, no temporary file ($(ls "$TMP/sig" | wc -l) files)" \
      || fail "SIG$1 during the GGUF write: exit $status, left: $left"
  else
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    fail "SIG$1: never saw the temporary file"
  fi
}
interrupt_write INT
interrupt_write TERM
finish
