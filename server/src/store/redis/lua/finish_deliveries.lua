-- Records delivery outcomes of partition P in one step, in order (`finish_entry` each;
-- one outcome is Outbox::finish_delivery).
-- KEYS: P..'outbox_due', then for each outcome its P..'delivery:'..sid,
-- P..'outbox:'..sid (an entry of an older build, moved when read) and P..'run:'..sid:
-- one slot.
-- ARGV: P, then per outcome 6 values: schedule_id, token, kind (delivered | retry |
-- failed | gone | abandon | defer), status, error, at (retry: delay ms; defer: due time
-- ms).
-- Reply: per outcome {applied, reason}.
local P = ARGV[1]
local out = {}
for i = 2, #ARGV, 6 do
  out[#out + 1] = finish_entry(P, ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]), ARGV[i + 4],
    tonumber(ARGV[i + 5]))
end
return out
