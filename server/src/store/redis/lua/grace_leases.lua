-- ARGV: P, grace_ms
-- When the store is served again after every instance was down: each held run of the
-- partition whose lease lapsed (or would lapse sooner) gets a lease ending grace_ms
-- from now, so its executor can reconnect and renew it or report its result before
-- the run is lost. Returns how many leases it extended.
local P = ARGV[1]
local now = store_now_ms()
local until_ms = now + tonumber(ARGV[2])
local n = 0
-- A held run's timer is at or before its lease end, so every lease to extend is here.
for _, sid in ipairs(redis.call('ZRANGEBYSCORE', P .. 'timers', '-inf', int(until_ms))) do
  local run = load_run(P, sid)
  if run and HELD[run.state] and run.deadlines.lease_expires < until_ms then
    run.deadlines.lease_expires = until_ms
    save_run(P, run)
    n = n + 1
  end
end
return n
