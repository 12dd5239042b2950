-- POST one AdmissionReview (the file named by the REVIEW environment variable) over and over, and
-- print the run's figures as one JSON line prefixed "WRKJSON " so latency.py need not parse wrk's
-- human-readable output. Latencies are in microseconds (wrk's unit).
local path = os.getenv("REVIEW")
local f = assert(io.open(path, "rb"), "cannot open REVIEW=" .. tostring(path))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

local statuses = {}
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  non2xx = 0
end

function response(status, headers, body)
  if status ~= 200 then
    non2xx = non2xx + 1
  end
end

function done(summary, latency, requests)
  local bad = 0
  for _, t in ipairs(threads) do
    bad = bad + (t:get("non2xx") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"durationUs":%d,"bytes":%d,"p50Us":%d,"p90Us":%d,"p99Us":%d,"p999Us":%d,' ..
    '"maxUs":%d,"meanUs":%.1f,"non200":%d,"errConnect":%d,"errRead":%d,"errWrite":%d,"errStatus":%d,' ..
    '"errTimeout":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean, bad, e.connect, e.read, e.write, e.status, e.timeout))
end
