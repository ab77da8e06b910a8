-- Claims due outbox entries of partition P in one step (`claim_entry` each; one entry
-- is Outbox::claim_delivery).
-- KEYS: P..'outbox_due', then for each schedule_id its P..'delivery:'..sid and
-- P..'outbox:'..sid (an entry of an older build, moved when read): one slot.
-- ARGV: P, lease_ms, then the schedule_ids.
-- Reply: {now, then per schedule_id asked, in order, {} when it is not due or gone, else
-- {job_id, url, body, attempts, created_at, token}}.
local P, lease = ARGV[1], tonumber(ARGV[2])
local out = { int(store_now_ms()) }
for i = 3, #ARGV do
  out[#out + 1] = claim_entry(P, ARGV[i], lease) or {}
end
return out
