#!/usr/bin/env bash
# kvslim run --chat: two piped turns answered on one session, the second feeding only its own
# tokens (the default template's text for the new turn, counted independently with tokenize);
# the arch models without a chat template (default); a bounded cache over many turns with an
# evicting policy; usage errors.
source "$(dirname "$0")/lib.bash"
M=$MODELS/gguf/stories260K-f32.gguf

# stories260K: two turns, greedy
status=0
printf 'hi\nhow are you\n' | "$KVS_BIN" run -m "$M" --chat -n 16 --temp 0 >"$TMP/out" 2>"$TMP/err" || status=$?
t1=$(grep -E '^kvslim run: turn 1: ' "$TMP/err" || true)
t2=$(grep -E '^kvslim run: turn 2: ' "$TMP/err" || true)
if [ "$status" -eq 0 ] && grep -q 'chat template default' "$TMP/err" && [ -n "$t1" ] && [ -n "$t2" ] &&
   [ "$(grep -c . "$TMP/out")" -ge 2 ]; then
  pass "two piped turns answered: $t1 / $t2"
else
  fail "two turns: status $status: $(head -c 600 "$TMP/err")"
fi
# turn N: fed K new tokens after P in the session, replied with R
read -r k1 p1 r1 <<<"$(sed -E 's/.*fed ([0-9]+) new tokens after ([0-9]+) .*replied with ([0-9]+)/\1 \2 \3/' <<<"$t1")"
read -r k2 p2 r2 <<<"$(sed -E 's/.*fed ([0-9]+) new tokens after ([0-9]+) .*replied with ([0-9]+)/\1 \2 \3/' <<<"$t2")"
# The first turn: BOS + "user: hi\nassistant:"; the second: the reply closed ("\n"), then
# "user: how are you\nassistant:", without BOS. Counted by kvslim tokenize on the same texts.
want1=$("$KVS_BIN" tokenize -m "$M" -p $'user: hi\nassistant:' | wc -l)
want2=$("$KVS_BIN" tokenize -m "$M" --no-bos -p $'\nuser: how are you\nassistant:' | wc -l)
if [ "$p1" = 0 ] && [ "$k1" = "$want1" ] && [ "$r1" -ge 1 ]; then
  pass "turn 1 fed its $k1 tokens into an empty session"
else
  fail "turn 1: fed $k1 after $p1 (want $want1 after 0), replied $r1"
fi
if [ "$k2" = "$want2" ] && [ "$p2" = $((k1 + r1)) ]; then
  pass "turn 2 fed only its $k2 new tokens after the $p2 already in the session (turn 1 + reply)"
else
  fail "turn 2: fed $k2 after $p2 (want $want2 after $((k1 + r1)))"
fi
if grep -qE "^prompt $((k1 + k2)) tokens, generated $((r1 + r2)) tokens, prefill .* KV .* held in f16" "$TMP/err"; then
  pass "stats line counts each turn once: $(tail -n 1 "$TMP/err")"
else
  fail "stats line: $(tail -n 1 "$TMP/err")"
fi
# Greedy and deterministic: the same conversation again gives the same replies.
printf 'hi\nhow are you\n' | "$KVS_BIN" run -m "$M" --chat -n 16 --temp 0 >"$TMP/out2" 2>/dev/null
cmp -s "$TMP/out" "$TMP/out2" && pass "greedy chat is deterministic" || fail "greedy chat differs between runs"

# tokenize --special: the control tokens' text becomes their ids (BOS 1, EOS 2 in tok512).
got=$("$KVS_BIN" tokenize -m "$M" --no-bos --special -p '<s>hi</s>' | tr '\n' ' ')
plain=$("$KVS_BIN" tokenize -m "$M" --no-bos -p '<s>hi</s>' | tr '\n' ' ')
if [[ $got == "1 "*" 2 " ]] && [[ " $plain" != *" 1 "* ]] && [[ " $plain" != *" 2 "* ]]; then
  pass "tokenize --special: '<s>hi</s>' -> $got (as text: $plain)"
else
  fail "tokenize --special: $got (as text: $plain)"
fi
# --chat-template llama2 on stories260K: its markers <s> and </s> are the vocabulary's control
# tokens, so the second turn, "</s><s>[INST] how are you [/INST]", feeds them as single ids.
status=0
printf 'hi\nhow are you\n' | "$KVS_BIN" run -m "$M" --chat --chat-template llama2 -n 8 --temp 0 \
  >"$TMP/out" 2>"$TMP/err" || status=$?
t2=$(grep -E '^kvslim run: turn 2: ' "$TMP/err" || true)
k2=$(sed -E 's/.*fed ([0-9]+) new tokens.*/\1/' <<<"$t2")
turn2=$("$KVS_BIN" tokenize -m "$M" --no-bos --special -p '</s><s>[INST] how are you [/INST]' | tr '\n' ' ')
if [ "$status" -eq 0 ] && grep -q 'chat template llama2' "$TMP/err" && [[ $turn2 == "2 1 "* ]] &&
   [ "$k2" = "$(wc -w <<<"$turn2")" ]; then
  pass "llama2 template: turn 2 fed $k2 tokens ($turn2)"
else
  fail "llama2 template: status $status, turn 2 fed '$k2', want the $(wc -w <<<"$turn2") of $turn2: $(head -c 300 "$TMP/err")"
fi
expect_fail "an unknown --chat-template" "the templates are default, llama3" \
  "$KVS_BIN" run -m "$M" --chat --chat-template nope
expect_fail "--chat-template without --chat" "needs --chat" "$KVS_BIN" run -m "$M" -p hi --chat-template chatml

# -p is the first user turn; stdin may be empty
status=0
"$KVS_BIN" run -m "$M" --chat -p "hello there" -n 4 </dev/null >"$TMP/out" 2>"$TMP/err" || status=$?
if [ "$status" -eq 0 ] && grep -q 'turn 1: fed' "$TMP/err" && ! grep -q 'turn 2' "$TMP/err"; then
  pass "--prompt as the first turn, then EOF"
else
  fail "--chat -p: status $status: $(head -c 400 "$TMP/err")"
fi

# The arch models have no tokenizer.chat_template: the default format, a system message.
for model in qwen2-f32 llama3-f32; do
  status=0
  printf 'hi\n\nhow are you\n' | "$KVS_BIN" run -m "$MODELS/arch/$model.gguf" --chat -n 8 --temp 0 \
    --system "Be brief." >"$TMP/out" 2>"$TMP/err" || status=$?
  if [ "$status" -eq 0 ] && grep -q 'chat template default' "$TMP/err" &&
     grep -q 'turn 2: fed' "$TMP/err" && ! grep -q 'turn 3' "$TMP/err"; then
    pass "$model: two turns (blank line skipped), $(grep 'turn 2' "$TMP/err")"
  else
    fail "$model: status $status: $(head -c 400 "$TMP/err")"
  fi
done

# An evicting policy keeps the cache bounded over a conversation longer than the context.
for i in $(seq 30); do echo "tell me a story number $i"; done >"$TMP/turns"
status=0
"$KVS_BIN" run -m "$M" --chat -n 16 --temp 0 --kv streaming:slots=48 <"$TMP/turns" >"$TMP/out" \
  2>"$TMP/err" || status=$?
if [ "$status" -eq 0 ] && grep -q 'turn 30: fed' "$TMP/err" && ! grep -q 'stopped' "$TMP/err" &&
   grep -qE 'KV [0-9.]+ KiB held in f16' "$TMP/err" &&
   awk '/^prompt/ { exit !($2 > 512) }' "$TMP/err"; then
  pass "30 turns past the 512-token context with streaming:slots=48: $(tail -n 1 "$TMP/err")"
else
  fail "bounded chat: status $status: $(tail -n 3 "$TMP/err")"
fi
# Without one, the full cache stops the conversation at the context, saying so.
status=0
"$KVS_BIN" run -m "$M" --chat -n 16 --temp 0 <"$TMP/turns" >"$TMP/out" 2>"$TMP/err" || status=$?
if grep -q 'context of 512 tokens is full\|context has room for' "$TMP/err" && [ "$status" -le 1 ]; then
  pass "full cache: the conversation ends at the context (status $status): $(grep -m1 'context' "$TMP/err")"
else
  fail "full cache over the context: status $status: $(tail -n 3 "$TMP/err")"
fi

expect_fail "--system without --chat" "needs --chat" "$KVS_BIN" run -m "$M" -p hi --system x
expect_fail "--chat with both -p and -f" "at most one of" "$KVS_BIN" run -m "$M" --chat -p hi -f "$TMP/turns"
expect_fail "--chat without a model" "needs -m MODEL" "$KVS_BIN" run --chat
status=0
"$KVS_BIN" run -m "$TMP/missing.gguf" --chat </dev/null >/dev/null 2>"$TMP/err" || status=$?
[ "$status" -eq 1 ] && pass "missing model: exit 1" || fail "missing model: exit $status"
finish
