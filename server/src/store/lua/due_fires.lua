-- ARGV: P, limit, instance, partition_lease_ms.
-- Returns {now, {{id, due, version, planned}...}, next_due|false}
local P, limit = ARGV[1], tonumber(ARGV[2])
local now = store_now_ms()
local pending = P .. 'pending'
-- While another instance works this partition, report nothing due and when to look
-- again: it expires soon after that instance stops reading here.
if tonumber(ARGV[4]) > 0 then
  local lease = P .. 'claimer'
  local holder = redis.call('GET', lease)
  if holder and holder ~= ARGV[3] then
    local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
    if not first[2] then
      return {int(now), {}, false}
    end
    return {int(now), {}, int(math.max(tonumber(first[2]), now + math.max(redis.call('PTTL', lease), 1)))}
  end
  redis.call('SET', lease, ARGV[3], 'PX', ARGV[4])
end
local due = redis.call('ZRANGEBYSCORE', pending, '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, limit)
local fires = {}
for i = 1, #due, 2 do
  local f = redis.call('HMGET', P .. 'job:' .. due[i], 'version', 'jit')
  local planned = tonumber(due[i + 1]) - tonumber(f[2] or '0')
  fires[#fires + 1] = {due[i], due[i + 1], f[1] or '0', int(planned)}
end
local n = #due / 2
local after = redis.call('ZRANGE', pending, n, n, 'WITHSCORES')
return {int(now), fires, after[2] or false}
