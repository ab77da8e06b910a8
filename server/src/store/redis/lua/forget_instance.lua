-- ARGV: K (the instances zset), instance
-- Forgets an instance whose beat has run out and whose triggers were all taken over;
-- one that beat again meanwhile (it was only stalled) stays.
local K, id = ARGV[1], ARGV[2]
local at = redis.call('ZSCORE', K, id)
if at and tonumber(at) < store_now_ms() then
  redis.call('ZREM', K, id)
  return 1
end
return 0
