-- ARGV: P, grace_ms, then schedule_ids of partition P (each run with a timer up to
-- about the grace's end, read by the caller).
-- When the store is served again after every instance was down: each held run among
-- them whose lease lapsed (or would lapse sooner) gets a lease ending grace_ms from
-- now, so its executor can reconnect and renew it or report its result before the run
-- is lost. Returns how many leases it extended.
local P = ARGV[1]
local now = store_now_ms()
local until_ms = now + tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  local run = load_run(P, ARGV[i])
  if run and HELD[run.state] and run.deadlines.lease_expires < until_ms then
    run.deadlines.lease_expires = until_ms
    save_run(P, run)
    n = n + 1
  end
end
return n
