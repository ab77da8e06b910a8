-- ARGV: P (the {nodes} prefix), node_id, instance
-- Only the instance holding the node's stream removes it: a node that reconnected to
-- another instance meanwhile stays registered there.
local P, id = ARGV[1], ARGV[2]
local key = P .. 'node:' .. id
if redis.call('HGET', key, 'inst') ~= ARGV[3] then
  return 0
end
redis.call('DEL', key)
redis.call('SREM', P .. 'ids', id)
return 1
