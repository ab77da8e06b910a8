-- ARGV: P, limit. Returns {now, {{id, due, version, planned}...}, next_due|false}
local P, limit = ARGV[1], tonumber(ARGV[2])
local now = store_now_ms()
local pending = P .. 'pending'
local due = redis.call('ZRANGEBYSCORE', pending, '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, limit)
local fires = {}
for i = 1, #due, 2 do
  local f = redis.call('HMGET', P .. 'job:' .. due[i], 'version', 'next_planned')
  fires[#fires + 1] = {due[i], due[i + 1], f[1] or '0', f[2] or due[i + 1]}
end
local n = #due / 2
local after = redis.call('ZRANGE', pending, n, n, 'WITHSCORES')
return {int(now), fires, after[2] or false}
