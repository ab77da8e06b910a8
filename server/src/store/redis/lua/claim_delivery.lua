-- ARGV: P, schedule_id, lease_ms. Claims a due outbox entry (`claim_entry`): in flight
-- under a new delivery token until now + lease. Reply: {} when not due or gone, else
-- {job_id, url, body, attempts, created_at, token, now}.
local P = ARGV[1]
local claimed = claim_entry(P, ARGV[2], tonumber(ARGV[3]))
if not claimed then
  return {}
end
claimed[7] = int(store_now_ms())
return claimed
