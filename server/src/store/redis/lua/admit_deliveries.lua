-- admit_delivery of several deliveries in one step, in order (each as if alone, one
-- after the other).
-- KEYS: per delivery B..'breaker:'..dest and B..'pace:'..dest: the {webhooks} slot.
-- ARGV: B, then per delivery 5 values: destination, holder, limit, lease_ms, probe_ms.
-- Reply: per delivery {verdict, n} (as admit_delivery's).
local B = ARGV[1]
local out = {}
for i = 2, #ARGV, 5 do
  out[#out + 1] = admit_slot(B, ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]),
    tonumber(ARGV[i + 4]))
end
return out
