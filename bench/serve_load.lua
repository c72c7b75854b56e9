-- wrk script for bench/serve_load.sh: POSTs one completion body, counts responses by status and
-- the generated tokens (usage.completion_tokens), and after a fixed number of responses stops
-- and interrupts wrk (SIGINT ends its run early, as Ctrl-C does), so the run is bounded in count
-- as well as by -d. Run it with one wrk thread (-t 1). Prints one `RESULT {json}` line.
--   wrk -t 1 -c C -d MAX --script bench/serve_load.lua URL -- REQUESTS BODY

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } kvs_timespec;
int clock_gettime(int clock, kvs_timespec *ts);
int kill(int pid, int sig);
int getpid(void);
]]
local ts = ffi.new("kvs_timespec")
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  limit = tonumber(args[1]) or 100
  wrk.method = "POST"
  wrk.path = "/v1/completions"
  wrk.body = args[2] or '{"prompt":"Once upon a time","max_tokens":16}'
  wrk.headers["Content-Type"] = "application/json"
  responses = 0
  tokens = 0
  statuses = {}
  t_start = now()
  t_last = t_start
end

function response(status, headers, body)
  if responses >= limit then return end
  responses = responses + 1
  t_last = now()
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
  if status == 200 then
    local n = body:match('"completion_tokens"%s*:%s*(%d+)')
    if n then tokens = tokens + tonumber(n) end
  end
  if responses == limit then
    wrk.thread:stop()
    ffi.C.kill(ffi.C.getpid(), 2) -- SIGINT: wrk's main thread stops waiting for -d
  end
end

function done(summary, latency, requests)
  local total, toks, by, seconds = 0, 0, {}, 0
  for _, t in ipairs(threads) do
    total = total + (t:get("responses") or 0)
    toks = toks + (t:get("tokens") or 0)
    local s = (t:get("t_last") or 0) - (t:get("t_start") or 0)
    if s > seconds then seconds = s end
    for k, v in pairs(t:get("statuses") or {}) do
      by[k] = (by[k] or 0) + v
    end
  end
  local parts = {}
  for k, v in pairs(by) do
    table.insert(parts, string.format('"%s":%d', k, v))
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"responses":%d,"tokens":%d,"seconds":%.4f,"status":{%s},' ..
    '"socket_errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
    total, toks, seconds, table.concat(parts, ","),
    e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
