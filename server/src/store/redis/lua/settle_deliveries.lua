-- Settles deliveries' slots in one step, in order, each as if alone (`settle_slot`;
-- one is Outbox::settle_delivery).
-- KEYS: per delivery B..'breaker:'..dest and B..'pace:'..dest: the {webhooks} slot.
-- ARGV: B, then per delivery 6 values: destination, holder, answered, threshold,
-- cool_down_ms, limit.
-- Reply: per delivery {state, until, changed (1/0)}, or {} when nothing was counted.
local B = ARGV[1]
local out = {}
for i = 2, #ARGV, 6 do
  out[#out + 1] = settle_slot(B, ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]),
    tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]))
end
return out
