#!/usr/bin/env bash
# `kvslim serve` over raw HTTP (curl): bad flags (exit 2), a model that does not load (exit 1
# after the listen line), the loading state (503), every error of the contract with OpenAI's
# error shape and the right status, the endpoints besides completions (/health, /, /v1/models,
# /tokenize, /detokenize, /metrics in the Prometheus text grammar), the SSE framing, the default
# chat template and --chat-template llama2 (markers as single tokens), a full queue (503 + Retry-After), clients that disconnect (their sequence freed
# within a second), the server's --kv / --kv-type defaults, SIGINT during a stream (the stream
# ends with [DONE], exit 0, the port released).
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/../serve/lib.bash"

# expect_error WHAT STATUS TYPE PARAM METHOD PATH [BODY [CURL ARGS...]]: the response has STATUS,
# a JSON body {"error":{"message":string,"type":TYPE,"param":PARAM,"code":...}} (PARAM "-": not
# checked, "null": JSON null) and Content-Type application/json.
expect_error() {
  local what=$1 status=$2 type=$3 param=$4; shift 4
  local got info valid eparam ecode emsg
  got=$(http "$@")
  if [ "$got" != "$status" ]; then
    fail "$what: status $got, expected $status: $(head -c 300 "$TMP/body")"; return
  fi
  # One jq for it all (a jq start is not free on a loaded machine).
  info=$(jq -r --arg t "$type" '[(.error.message | type == "string" and length > 0) and .error.type == $t
        and (.error | has("param") and has("code")), (.error.param | tojson), (.error.code | tojson),
        (.error.message | tostring | .[0:160])] | @tsv' "$TMP/body" 2>/dev/null || true)
  IFS=$'\t' read -r valid eparam ecode emsg <<<"$info"
  if [ "$valid" != true ]; then
    fail "$what: $status but not an OpenAI error of type $type: $(head -c 300 "$TMP/body")"; return
  fi
  if [ "$param" != - ] && [ "$eparam" != "$( [ "$param" = null ] && echo null || echo "\"$param\"")" ]; then
    fail "$what: param $eparam, expected $param"; return
  fi
  if ! grep -qi '^content-type: application/json' "$TMP/headers"; then
    fail "$what: Content-Type $(grep -i '^content-type' "$TMP/headers" | tr -d '\r')"; return
  fi
  pass "$what: $status $type param=$eparam code=$ecode: $emsg"
}
# expect_status WHAT STATUS METHOD PATH [BODY [CURL ARGS...]]
expect_status() {
  local what=$1 status=$2; shift 2
  local got; got=$(http "$@")
  [ "$got" = "$status" ] && pass "$what: $status" || fail "$what: status $got, expected $status: $(head -c 300 "$TMP/body")"
}
scrape() { # FILE: /metrics into FILE
  local got; got=$(http GET /metrics)
  cp "$TMP/body" "$1"; cp "$TMP/headers" "$1.headers"
  [ "$got" = 200 ] || fail "/metrics: status $got"
}
# check_sse FILE KIND: the SSE framing of a stream: `data: <json>` events separated by blank
# lines, then `data: [DONE]`; the last JSON chunk carries finish_reason and usage. Prints a summary.
check_sse() {
  "$PYTHON" - "$1" "$2" <<'PY'
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read(); kind = sys.argv[2]
assert raw.endswith("\n\n"), "the stream does not end with a blank line"
events = raw[:-2].split("\n\n")
assert events[-1] == "data: [DONE]", f"last event {events[-1][:80]!r}, not [DONE]"
chunks = []
for ev in events[:-1]:
    assert ev.startswith("data: ") and "\n" not in ev, f"event not one data line: {ev[:80]!r}"
    chunks.append(json.loads(ev[6:]))
assert len(chunks) >= 2, f"{len(chunks)} chunks"
text = ""
for c in chunks[:-1]:
    ch = c["choices"][0]
    assert ch["finish_reason"] is None, f"finish_reason {ch['finish_reason']} before the last chunk"
    text += ch["text"] if kind == "text_completion" else ch["delta"].get("content", "")
last = chunks[-1]
assert all(c["object"] == kind for c in chunks), "chunk object"
assert last["choices"][0]["finish_reason"] in ("stop", "length"), "last finish_reason"
if kind != "text_completion":
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant", "the first delta is not the role"
u = last["usage"]
assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
assert "kv" in last and "timings" in last, "last chunk lacks kv / timings"
print(f"{len(chunks)} chunks + [DONE], {u['completion_tokens']} tokens, finish {last['choices'][0]['finish_reason']}, text {text[:40]!r}")
PY
}

# --- flags and a model that does not load -------------------------------------------------------
# bad_flag WHAT PATTERN ARGS...: `kvslim serve ARGS` exits 2 at once, naming PATTERN on stderr
# (--port 0 in ARGS: a flag accepted by mistake leaves a server that `timeout` ends).
bad_flag() {
  local what=$1 pattern=$2 status=0; shift 2
  timeout 10 "$KVS_BIN" serve "$@" >/dev/null 2>"$TMP/flag.err" || status=$?
  if [ "$status" -eq 2 ] && grep -qi -- "$pattern" "$TMP/flag.err"; then pass "$what: exit 2, $(head -n 1 "$TMP/flag.err" | head -c 160)"
  else fail "$what: exit $status, stderr: $(head -c 300 "$TMP/flag.err")"; fi
}
bad_flag "no model" "model" --port 0
bad_flag "--port abc" "--port" -m "$SERVE_MODEL" --port abc
bad_flag "--parallel 0" "--parallel" -m "$SERVE_MODEL" --port 0 --parallel 0
bad_flag "--max-body x" "--max-body" -m "$SERVE_MODEL" --port 0 --max-body x
bad_flag "--kv bogus" "--kv" -m "$SERVE_MODEL" --port 0 --kv bogus:budget=0.5
bad_flag "--kv-type f7" "--kv-type" -m "$SERVE_MODEL" --port 0 --kv-type f7
bad_flag "--frobnicate" "--frobnicate" -m "$SERVE_MODEL" --port 0 --frobnicate
head -c 4096 /dev/urandom >"$TMP/garbage.gguf"
status=0
timeout 20 "$KVS_BIN" serve -m "$TMP/garbage.gguf" --port 0 >/dev/null 2>"$TMP/garbage.err" || status=$?
if [ "$status" -eq 1 ] && grep -q 'kvslim serve: listening on http://' "$TMP/garbage.err" \
   && [ "$(grep -v 'listening on' "$TMP/garbage.err" | grep -c .)" -ge 1 ]; then
  pass "a model that does not load: listen line, then exit 1: $(grep -v 'listening on' "$TMP/garbage.err" | head -n 1 | head -c 160)"
else fail "garbage model: exit $status: $(head -c 300 "$TMP/garbage.err")"; fi

# While the model loads: a FIFO as the model file holds the load in open() until a writer comes.
mkfifo "$TMP/slow.gguf"
"$KVS_BIN" serve -m "$TMP/slow.gguf" --host 127.0.0.1 --port 0 >/dev/null 2>"$TMP/slow.err" &
slow_pid=$!
SERVE_PIDS+=("$slow_pid")
serve_watchdog "$slow_pid"
for i in $(seq 100); do grep -q 'listening on' "$TMP/slow.err" && break; sleep 0.1; done
SERVE_URL=$(grep -m 1 -o 'http://[^ ]*' "$TMP/slow.err" || true)
if [ -n "$SERVE_URL" ]; then
  code=$(http GET /health)
  [ "$code" = 503 ] && jq -e '.status == "loading"' "$TMP/body" >/dev/null 2>&1 \
    && pass "loading: /health 503 $(cat "$TMP/body")" || fail "loading: /health $code $(head -c 200 "$TMP/body")"
  expect_error "loading: /v1/models" 503 server_error - GET /v1/models
  expect_error "loading: /v1/completions" 503 server_error - POST /v1/completions '{"prompt":"Once"}'
else
  fail "FIFO model: no listen line: $(head -c 300 "$TMP/slow.err")"
fi
timeout 5 bash -c 'exec 3>"$1"; sleep 0.2' _ "$TMP/slow.gguf" || true  # a writer that sends nothing
status=0
for i in $(seq 100); do kill -0 "$slow_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$slow_pid" 2>/dev/null && { fail "FIFO model: still running 10 s after an empty model"; kill -KILL "$slow_pid" || true; }
wait "$slow_pid" || status=$?
[ "$status" -eq 1 ] && pass "an empty model after the listen line: exit 1: $(grep -v 'listening on\|GET\|POST' "$TMP/slow.err" | head -n 1 | head -c 160)" \
  || fail "an empty model: exit $status: $(tail -n 3 "$TMP/slow.err")"

# --- server 1: API key, small context, small body limit ------------------------------------------
SERVE_KEY=""
KEY=sekrit-$$
serve_start main --api-key "$KEY" --ctx 128 --max-body 16384
MAIN_PID=$SERVE_PID MAIN_PORT=$SERVE_PORT

code=$(http GET /health)
[ "$code" = 200 ] && jq -e '.status == "ok"' "$TMP/body" >/dev/null && pass "/health without a key: 200 $(cat "$TMP/body")" \
  || fail "/health: $code $(head -c 200 "$TMP/body")"
code=$(http GET /)
if [ "$code" = 200 ] && grep -qi '^content-type: text/html' "$TMP/headers" && grep -q 'id="pane-a"' "$TMP/body" \
   && grep -q 'id="run"' "$TMP/body"; then pass "/ without a key: 200 text/html, the page ($(wc -c <"$TMP/body") bytes)"
else fail "/: $code $(grep -i '^content-type' "$TMP/headers" | tr -d '\r')"; fi

expect_error "no API key" 401 authentication_error - GET /v1/models
expect_error "no API key, completions" 401 authentication_error - POST /v1/completions '{"prompt":"x"}'
SERVE_KEY=wrong-key
expect_error "wrong API key" 401 authentication_error - GET /v1/models
expect_error "wrong API key, /metrics" 401 authentication_error - GET /metrics
SERVE_KEY=$KEY

code=$(http GET /v1/models)
[ "$code" = 200 ] && jq -e --arg id "$SERVE_MODEL_ID" '.object == "list" and (.data | length) == 1 and .data[0].id == $id
    and .data[0].object == "model" and .data[0].owned_by == "kvslim" and (.data[0].created | type == "number")' \
    "$TMP/body" >/dev/null && pass "/v1/models: $(jq -c .data[0] "$TMP/body")" || fail "/v1/models: $code $(head -c 300 "$TMP/body")"

scrape "$TMP/m0"

# Errors of the request body.
expect_error "malformed JSON" 400 invalid_request_error - POST /v1/completions '{"prompt": "Once", "max_tokens": 4,'
expect_error "not an object" 400 invalid_request_error - POST /v1/completions '[1, 2]'
expect_error "empty body" 400 invalid_request_error - POST /v1/completions '' -H 'Content-Type: application/json' --data-binary ''
for f in 'max_tokens:"ten"' 'temperature:"hot"' 'top_p:[1]' 'top_k:"5"' 'seed:"s"' 'stream:"yes"' \
         'stop:3' 'kv:5' 'kv_type:true' 'prompt:5'; do
  name=${f%%:*} value=${f#*:}
  case $name in
    prompt) body="{\"prompt\":$value}" ;;
    max_tokens) body="{\"prompt\":\"Once\",\"max_tokens\":$value}" ;;
    *) body="{\"prompt\":\"Once\",\"max_tokens\":4,\"$name\":$value}" ;;
  esac
  expect_error "wrong type $name=$value" 400 invalid_request_error "$name" POST /v1/completions "$body"
done
expect_error "chat: messages a string" 400 invalid_request_error messages POST /v1/chat/completions '{"messages":"hi"}'
expect_error "chat: a message without content" 400 invalid_request_error - POST /v1/chat/completions '{"messages":[{"role":"user"}]}'
expect_error "n=2" 400 invalid_request_error n POST /v1/completions '{"prompt":"Once","n":2}'
expect_error "max_tokens 0" 400 invalid_request_error max_tokens POST /v1/completions '{"prompt":"Once","max_tokens":0}'
expect_error "max_tokens -5" 400 invalid_request_error max_tokens POST /v1/completions '{"prompt":"Once","max_tokens":-5}'
expect_error "bad kv policy" 400 invalid_request_error kv POST /v1/completions '{"prompt":"Once","kv":"nosuch:budget=0.5"}'
missing=""
for p in full streaming h2o snapkv nacl hashevict; do grep -q "$p" "$TMP/body" || missing="$missing $p"; done
[ -z "$missing" ] && pass "bad kv: the message lists the policies" || fail "bad kv: message lacks$missing: $(head -c 300 "$TMP/body")"
expect_error "bad kv parameter" 400 invalid_request_error kv POST /v1/completions '{"prompt":"Once","kv":"snapkv:budget=7"}'
expect_error "bad kv_type" 400 invalid_request_error kv_type POST /v1/completions '{"prompt":"Once","kv_type":"f7"}'
long=$(for i in $(seq 40); do printf 'Once upon a time, there was a little girl named Lily. '; done)
expect_error "prompt longer than --ctx 128" 400 invalid_request_error - POST /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":4}"
[ "$(jq -r .error.code "$TMP/body")" = context_length_exceeded ] && pass "long prompt: code context_length_exceeded" \
  || fail "long prompt: code $(jq -c .error.code "$TMP/body")"
head -c 20000 /dev/zero | tr '\0' 'a' | sed 's/^/{"prompt":"/; s/$/"}/' >"$TMP/big.json"
expect_error "body of 20 kB over --max-body 16384" 413 invalid_request_error - POST /v1/completions "@$TMP/big.json"
expect_error "unknown path" 404 invalid_request_error - GET /v1/nothing
expect_error "unknown path, POST" 404 invalid_request_error - POST /v2/completions '{"prompt":"x"}'
expect_error "GET /v1/completions" 405 invalid_request_error - GET /v1/completions
expect_error "POST /v1/models" 405 invalid_request_error - POST /v1/models '{}'
expect_error "DELETE /v1/chat/completions" 405 invalid_request_error - DELETE /v1/chat/completions

# Valid requests.
code=$(http POST /v1/completions '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"frobnicate":{"a":[1,2]},"user":"u","logprobs":null}')
[ "$code" = 200 ] && jq -e '.object == "text_completion" and (.choices[0].text | length > 0)' "$TMP/body" >/dev/null \
  && pass "unknown fields ignored: 200, text $(jq -c .choices[0].text "$TMP/body")" || fail "unknown fields: $code $(head -c 300 "$TMP/body")"
grep -qi '^content-type: application/json' "$TMP/headers" && pass "completion Content-Type application/json" \
  || fail "completion Content-Type: $(grep -i '^content-type' "$TMP/headers")"
code=$(http POST /v1/completions '{"prompt":["Once upon a time"],"max_tokens":8,"temperature":0,"kv":"snapkv:budget=0.2"}')
[ "$code" = 200 ] && jq -e '.kv == "snapkv:budget=0.2" and .usage.kv_bytes > 0 and (.timings.decode_tok_per_s | type == "number")' \
  "$TMP/body" >/dev/null && pass "prompt as an array of one string, snapkv: $(jq -c .usage "$TMP/body")" \
  || fail "prompt array: $code $(head -c 300 "$TMP/body")"
http POST /v1/completions '{"prompt":"Once upon a time","max_tokens":12,"temperature":0,"stream":true,"kv":"streaming:budget=0.5"}' >"$TMP/code" || true
if [ "$(cat "$TMP/code")" = 200 ] && grep -qi '^content-type: text/event-stream' "$TMP/headers" \
   && summary=$(check_sse "$TMP/body" text_completion 2>&1); then pass "completion stream: text/event-stream, $summary"
else fail "completion stream: $(cat "$TMP/code") ${summary:-} $(head -c 300 "$TMP/body")"; fi
summary=""
http POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":12,"temperature":0,"stream":true}' >"$TMP/code" || true
if [ "$(cat "$TMP/code")" = 200 ] && summary=$(check_sse "$TMP/body" chat.completion.chunk 2>&1); then pass "chat stream: role first, $summary"
else fail "chat stream: $(cat "$TMP/code") ${summary:-} $(head -c 300 "$TMP/body")"; fi

# The default chat template (stories260K has none): `<role>: <content>\n` per message, then
# `assistant:`; the chat prompt has the tokens of that text (with BOS).
code=$(http POST /v1/chat/completions '{"messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"Hi there"}],"max_tokens":2}')
chat_prompt=$(jq .usage.prompt_tokens "$TMP/body" 2>/dev/null || true)
http POST /tokenize '{"content":"system: Be kind.\nuser: Hi there\nassistant:"}' >/dev/null
templ=$(jq '.tokens | length' "$TMP/body" 2>/dev/null || true)
[ "$code" = 200 ] && [ -n "$chat_prompt" ] && [ "$chat_prompt" = "$templ" ] \
  && pass "chat prompt: $chat_prompt tokens, those of 'system: Be kind.\nuser: Hi there\nassistant:'" \
  || fail "chat prompt: $code, $chat_prompt tokens; the default template's text has $templ"

# /tokenize and /detokenize.
text="Once upon a time, Lily saw a big red ball."
code=$(http POST /tokenize "{\"content\":\"$text\",\"add_special\":false}")
tokens=$(jq -c .tokens "$TMP/body" 2>/dev/null || true)
http POST /tokenize "{\"content\":\"$text\"}" >/dev/null
with_bos=$(jq '.tokens | length' "$TMP/body" 2>/dev/null || echo 0)
http POST /detokenize "{\"tokens\":$tokens}" >/dev/null
back=$(jq -r .content "$TMP/body" 2>/dev/null || true)
if [ "$code" = 200 ] && [ "$(jq length <<<"$tokens")" -gt 5 ] && { [ "$back" = "$text" ] || [ "$back" = " $text" ]; }; then
  pass "/tokenize + /detokenize round trip: $(jq length <<<"$tokens") tokens -> '$back'"
else fail "tokenize round trip: $code tokens $tokens -> '$back'"; fi
[ "$with_bos" -eq $(( $(jq length <<<"$tokens") + 1 )) ] && pass "/tokenize add_special (default true): one more token (BOS)" \
  || fail "add_special: $with_bos tokens vs $(jq length <<<"$tokens")"
expect_error "/detokenize: a token out of the vocabulary" 400 invalid_request_error - POST /detokenize '{"tokens":[1,999999]}'
expect_error "/tokenize: content a number" 400 invalid_request_error content POST /tokenize '{"content":5}'

# /metrics: the grammar, the names, counters that moved, idle gauges.
scrape "$TMP/m1"
grep -qi '^content-type: text/plain; *version=0.0.4' "$TMP/m1.headers" && pass "/metrics Content-Type text/plain; version=0.0.4" \
  || fail "/metrics Content-Type: $(grep -i '^content-type' "$TMP/m1.headers" | tr -d '\r')"
if out=$("$PYTHON" - "$TMP/m1" <<'PY' 2>&1
import re, sys
name = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
value = r"(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|NaN|[+-]Inf)"
sample = re.compile(rf"^({name})(?:\{{(?:{label}(?:,{label})*,?)?\}})? {value}(?: -?[0-9]+)?$")
helps, types, samples = set(), {}, set()
for n, line in enumerate(open(sys.argv[1], encoding="utf-8").read().split("\n"), 1):
    if line == "": continue
    if line.startswith("#"):
        m = re.match(rf"^# (HELP|TYPE) ({name}) (.*)$", line)
        if m and m[1] == "HELP": helps.add(m[2])
        elif m and m[1] == "TYPE":
            assert m[3] in ("counter", "gauge", "histogram", "summary", "untyped"), f"line {n}: type {m[3]}"
            types[m[2]] = m[3]
        continue
    m = sample.match(line)
    assert m, f"line {n} is not a Prometheus sample: {line!r}"
    samples.add(m[1])
for s in samples:
    base = re.sub(r"_(bucket|sum|count)$", "", s)
    assert s in helps or base in helps, f"{s}: no # HELP"
    assert s in types or base in types, f"{s}: no # TYPE"
need = ["kvslim_requests_total", "kvslim_prompt_tokens_total", "kvslim_generated_tokens_total",
        "kvslim_decode_tokens_per_second", "kvslim_kv_bytes_held", "kvslim_kv_bytes_bound",
        "kvslim_queue_depth", "kvslim_sequences_busy", "kvslim_sequences_max",
        "kvslim_policy_requests_total", "kvslim_policy_generated_tokens_total", "kvslim_policy_kv_bytes_held"]
missing = [x for x in need if x not in samples]
assert not missing, f"missing metrics: {missing}"
print(f"{len(samples)} metric names, every line in the grammar, HELP and TYPE for each")
PY
); then pass "/metrics: $out"; else fail "/metrics: $out"; fi
v0=$(metric 'kvslim_requests_total{endpoint="/v1/completions",status="200"}' "$TMP/m0")
v1=$(metric 'kvslim_requests_total{endpoint="/v1/completions",status="200"}' "$TMP/m1")
[ -n "$v1" ] && awk -v a="${v0:-0}" -v b="$v1" 'BEGIN { exit !(b >= a + 3) }' \
  && pass "requests_total{/v1/completions,200}: ${v0:-absent} -> $v1" || fail "requests_total{/v1/completions,200}: ${v0:-absent} -> ${v1:-absent}"
v1=$(grep -c '^kvslim_requests_total{.*status="400"' "$TMP/m1" || true)
[ "$v1" -ge 1 ] && pass "requests_total counts the 400s ($v1 series)" || fail "no kvslim_requests_total series with status 400"
for m in kvslim_prompt_tokens_total kvslim_generated_tokens_total; do
  a=$(metric $m "$TMP/m0") b=$(metric $m "$TMP/m1")
  [ -n "$b" ] && awk -v a="${a:-0}" -v b="$b" 'BEGIN { exit !(b > a) }' && pass "$m: ${a:-absent} -> $b" || fail "$m: ${a:-absent} -> ${b:-absent}"
done
v=$(metric 'kvslim_policy_requests_total{kv="snapkv:budget=0.2"}' "$TMP/m1")
[ "${v:-0}" = 1 ] && pass "policy_requests_total{kv=\"snapkv:budget=0.2\"} 1" || fail "policy_requests_total{kv=\"snapkv:budget=0.2\"}: ${v:-absent}"
for m in kvslim_queue_depth kvslim_sequences_busy kvslim_kv_bytes_held; do
  v=$(metric $m "$TMP/m1")
  [ "$v" = 0 ] && pass "idle: $m 0" || fail "idle: $m ${v:-absent}"
done
v=$(metric kvslim_sequences_max "$TMP/m1")
[ "$v" = 2 ] && pass "kvslim_sequences_max 2 (--parallel default)" || fail "kvslim_sequences_max ${v:-absent}"
v=$(metric kvslim_kv_bytes_bound "$TMP/m1")
awk -v v="${v:-0}" 'BEGIN { exit !(v > 0) }' && pass "kvslim_kv_bytes_bound $v" || fail "kvslim_kv_bytes_bound ${v:-absent}"
serve_stop "$MAIN_PID" TERM "server main" "$MAIN_PORT"

# --- server 2: one sequence, no queue: 503, disconnects, SIGINT ---------------------------------
SERVE_KEY=""
serve_start single --parallel 1 --queue 0 --kv streaming:budget=0.5 --kv-type f16
# A request that would decode for tens of seconds unless it is stopped: greedy decoding that sees
# only its last two tokens (streaming, no sinks) falls into a loop without an end of story, and
# position shifting runs it past the context.
held='{"prompt":"the the the the","max_tokens":300000,"temperature":0,"kv":"streaming:slots=2,sinks=0,shift=on","stream":true}'
# hold FILE [CURL ARGS]: starts a long streaming request in the background (HOLD_PID), returns
# once its first event arrived (10 s at most).
hold() {
  curl -sN --max-time 60 -H 'Content-Type: application/json' -d "$held" "${@:2}" "$SERVE_URL/v1/completions" >"$1" 2>/dev/null &
  HOLD_PID=$!
  SERVE_CHILDREN+=("$HOLD_PID")
  local i
  for i in $(seq 200); do grep -q '^data: {' "$1" && return 0; sleep 0.05; done
  fail "held request: no event within 10 s: $(head -c 200 "$1")"
  return 1
}
busy() { http GET /metrics >/dev/null; metric kvslim_sequences_busy "$TMP/body"; }

if hold "$TMP/held1"; then
  v=$(busy); [ "$v" = 1 ] && pass "a long stream running: sequences_busy 1" || fail "during a stream: sequences_busy ${v:-absent}"
  expect_error "second request with --parallel 1 --queue 0" 503 overloaded_error - POST /v1/completions '{"prompt":"Once","max_tokens":4}'
  ra=$(grep -i '^retry-after:' "$TMP/headers" | tr -d '\r' | awk '{print $2}' || true)
  [ "$ra" = 1 ] && pass "503 has Retry-After: 1" || fail "503 Retry-After: '${ra:-absent}'"
  grep -q '\[DONE\]' "$TMP/held1" && fail "the held stream ended by itself (the disconnect check proves nothing)"
  kill "$HOLD_PID" 2>/dev/null || true; wait "$HOLD_PID" 2>/dev/null || true
  t0=$(date +%s%N) v=1
  for i in $(seq 40); do v=$(busy); [ "$v" = 0 ] && break; sleep 0.025; done
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$v" = 0 ] && [ "$ms" -le 1000 ] && pass "streaming client gone: sequences_busy 0 after $ms ms" \
    || fail "streaming client gone: sequences_busy ${v:-absent} after $ms ms"
fi
# The same for a client that is not streaming: curl gives up after 1 s.
t0=$(date +%s%N)
curl -s --max-time 1 -H 'Content-Type: application/json' -d "${held/\"stream\":true/\"stream\":false}" \
  "$SERVE_URL/v1/completions" >/dev/null 2>&1 && fail "the non-streamed long request finished within 1 s"
for i in $(seq 40); do v=$(busy); [ "$v" = 0 ] && break; sleep 0.025; done
ms=$(( ($(date +%s%N) - t0) / 1000000 - 1000 ))
[ "$v" = 0 ] && [ "$ms" -le 1000 ] && pass "non-streaming client gone: sequences_busy 0 $ms ms after it left" \
  || fail "non-streaming client gone: sequences_busy ${v:-absent} $ms ms after it left"
expect_status "the sequence serves again" 200 POST /v1/completions '{"prompt":"Once upon a time","max_tokens":4}'
v=$(jq -r '"\(.kv) \(.kv_type)"' "$TMP/body" 2>/dev/null || true)
[ "$v" = "streaming:budget=0.5 f16" ] && pass "a request without kv / kv_type: the server's --kv and --kv-type ($v)" \
  || fail "server defaults --kv streaming:budget=0.5 --kv-type f16: got '$v'"
http GET /metrics >/dev/null
v=$(metric kvslim_queue_depth "$TMP/body")
[ "$v" = 0 ] && pass "idle: queue_depth 0" || fail "idle: queue_depth ${v:-absent}"

# SIGINT while a stream runs: it ends with a final chunk or an error event, then [DONE].
if hold "$TMP/held2"; then
  kill -INT "$SERVE_PID"
  for i in $(seq 100); do kill -0 "$HOLD_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$HOLD_PID" 2>/dev/null; then fail "SIGINT: the stream still open after 10 s"; kill "$HOLD_PID" 2>/dev/null || true; fi
  wait "$HOLD_PID" 2>/dev/null || true
  last=$(grep '^data: ' "$TMP/held2" | tail -n 2 | head -n 1 || true)
  if [ "$(grep '^data: ' "$TMP/held2" | tail -n 1)" = "data: [DONE]" ] &&
     jq -e '(.choices[0].finish_reason | . == "stop" or . == "length") or has("error")' <<<"${last#data: }" >/dev/null 2>&1; then
    pass "SIGINT: the stream ended with $(jq -c 'if has("error") then .error.message else .choices[0].finish_reason end' <<<"${last#data: }") then [DONE]"
  else fail "SIGINT: the stream ended with $(tail -c 300 "$TMP/held2")"; fi
fi
serve_stop "$SERVE_PID" - "server single, SIGINT during a stream"

# --chat-template llama2: stories260K's <s> and </s> are control tokens, so the template's text is
# tokenized with them as single ids: the chat prompt has the tokens `kvslim tokenize --special`
# gives for it (with BOS).
serve_start tpl --chat-template llama2
if grep -q 'chat template llama2' "$SERVE_LOG"; then pass "--chat-template llama2: named at start-up"
else fail "--chat-template llama2: $(grep -m1 'loaded' "$SERVE_LOG")"; fi
code=$(http POST /v1/chat/completions '{"messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye"}],"max_tokens":2}')
chat_prompt=$(jq .usage.prompt_tokens "$TMP/body" 2>/dev/null || true)
ids=$("$KVS_BIN" tokenize -m "$SERVE_MODEL" --special \
  -p $'[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST] Hello.</s><s>[INST] Bye [/INST]' | tr '\n' ' ')
n_ids=$(wc -w <<<"$ids")
if [ "$code" = 200 ] && [ "$chat_prompt" = "$n_ids" ] && [[ " $ids" == *" 2 1 "* ]]; then
  pass "llama2 chat prompt: $chat_prompt tokens, </s><s> as the ids 2 1"
else
  fail "llama2 chat prompt: $code, ${chat_prompt:-?} tokens, want $n_ids ($ids)"
fi
serve_stop "$SERVE_PID" TERM "server tpl"
status=0
"$KVS_BIN" serve -m "$SERVE_MODEL" --port 0 --chat-template jinja >/dev/null 2>"$TMP/err" || status=$?
[ "$status" = 2 ] && grep -q 'the templates are' "$TMP/err" && pass "an unknown --chat-template: exit 2" \
  || fail "an unknown --chat-template: exit $status: $(head -c 200 "$TMP/err")"
finish
