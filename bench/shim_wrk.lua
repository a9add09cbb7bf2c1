-- wrk script of bench/shim: the request comes from the environment
-- (SHIM_BENCH_METHOD, SHIM_BENCH_BODY as JSON, SHIM_BENCH_SECRET as the
-- bearer token), and the summary is one machine-readable line:
--   WRK requests=N duration_us=N p50_us=N p99_us=N status=N connect=N read=N write=N timeout=N
-- where status counts answers with a status of 400 or more.
wrk.method = os.getenv("SHIM_BENCH_METHOD") or "GET"
local body = os.getenv("SHIM_BENCH_BODY")
if body ~= nil and body ~= "" then
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
end
local secret = os.getenv("SHIM_BENCH_SECRET")
if secret ~= nil and secret ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. secret
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK requests=%d duration_us=%d p50_us=%d p99_us=%d status=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect, e.read, e.write, e.timeout))
end
