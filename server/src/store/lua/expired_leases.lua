-- ARGV: P, limit. Returns {{sid, holder, token, expires}...}
local P = ARGV[1]
local now = store_now_ms()
local sids = redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', int(now), 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, sid in ipairs(sids) do
  local cur = redis.call('HMGET', P .. 'lease:' .. sid, 'holder', 'token', 'expires')
  if cur[1] then
    out[#out + 1] = {sid, cur[1], cur[2], cur[3]}
  else
    redis.call('ZREM', P .. 'leases', sid)
  end
end
return out
