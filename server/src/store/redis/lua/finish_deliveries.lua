-- finish_delivery of several outcomes of partition P in one step, in order.
-- KEYS: P..'outbox_due', then for each outcome its P..'delivery:'..sid,
-- P..'outbox:'..sid (an entry of an older build, moved when read) and P..'run:'..sid:
-- one slot.
-- ARGV: P, then per outcome 6 values: schedule_id, token, kind, status, error, at (as
-- finish_delivery's).
-- Reply: per outcome {applied, reason}.
local P = ARGV[1]
local out = {}
for i = 2, #ARGV, 6 do
  out[#out + 1] = finish_entry(P, ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]), ARGV[i + 4],
    tonumber(ARGV[i + 5]))
end
return out
