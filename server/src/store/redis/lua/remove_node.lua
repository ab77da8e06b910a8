-- ARGV: N (the {nodes} prefix), node_id, instance, session
-- Only the stream that registered the node removes it: a node that reconnected
-- meanwhile (to this instance or another) stays registered.
-- Returns {0} when it was not removed, else {1, the runs leased to the node} (none in
-- a cluster, where node_slots.lua counts them in a slot of the node's own).
local N, id = ARGV[1], ARGV[2]
local key = N .. 'node:' .. id
local inst, rec = unpack(redis.call('HMGET', key, 'inst', 'rec'))
if inst ~= ARGV[3] or not rec then
  return { 0 }
end
local session = cjson.decode(rec).session
if type(session) ~= 'string' then
  session = ''
end
if session ~= ARGV[4] then
  return { 0 }
end
redis.call('DEL', key)
redis.call('SREM', N .. 'ids', id)
return { 1, redis.call('SMEMBERS', N .. 'busy:' .. id) }
