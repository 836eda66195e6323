-- wrk script of scripts/bench_webhook.py: POSTs each line of the file named after `--` once,
-- in order, over wrk's connections, and ends wrk when every one is answered. One thread
-- (`wrk -t1`): the lines are that thread's, and the first call of `request` below is wrk's own.
-- Prints one JSON line: answered (200), failed (any other status but the 404 of the
-- placeholder below), the seconds from the first post to the last answer, and latencies (wrk
-- times every answer: only the posts are sent, so only they are timed).
local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } timespec;
  int clock_gettime(int clock, timespec *now);
  int getpid(void);
  int kill(int pid, int signal);
]]
local CLOCK_MONOTONIC, SIGINT = 1, 2
local clock = ffi.new("timespec")
local function now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, clock)
  return tonumber(clock.tv_sec) + tonumber(clock.tv_nsec) / 1e9
end

local bodies = {}
-- Globals, so that `done` reads them through the thread (thread:get).
calls, answered, failed, first_sent, last_answered = 0, 0, 0, 0, 0

function setup(thread)
  the_thread = thread
end

function init(args)
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
end

local granted = 0  -- sends let through by `delay`: each is followed by one call of `request`

function delay()
  -- wrk asks before every send of every connection, and calls `request` only once the delay
  -- has run out, after other connections may have asked too: the bodies are counted out here,
  -- so that no connection is let through when every body is promised to another. A connection
  -- with no body left waits, until wrk ends, instead of asking for the placeholder: a loop of
  -- those would take the receiver's CPU while the last answers are being committed, and wrk
  -- would time them with the posts.
  if granted >= #bodies then
    return 3600 * 1000
  end
  granted = granted + 1
  return 0
end

function request()
  -- wrk calls this once before it sends anything (to check for pipelining) and discards it,
  -- so the first body goes with the second call.
  calls = calls + 1
  local body = bodies[calls - 1]
  if body == nil then
    -- Not reached while `delay` counts the bodies out; wrk needs a request all the same: a
    -- path that stores nothing.
    return wrk.format("GET", "/wrk-done")
  end
  if calls == 2 then
    first_sent = now()
  end
  return wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, body)
  if status == 200 then
    answered = answered + 1
  elseif status ~= 404 then
    failed = failed + 1
  end
  if answered + failed == #bodies then
    last_answered = now()
    ffi.C.kill(ffi.C.getpid(), SIGINT) -- wrk stops at SIGINT and reports
  end
end

function done(summary, latency, requests)
  local t = the_thread
  io.write(string.format(
    '{"answered": %d, "failed": %d, "seconds": %.6f, "p50_ms": %.3f, "p99_ms": %.3f}\n',
    t:get("answered"), t:get("failed"), t:get("last_answered") - t:get("first_sent"),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
