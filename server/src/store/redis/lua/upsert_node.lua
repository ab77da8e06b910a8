-- ARGV: P (the {nodes} prefix), node_id, record_json, instance, ttl_ms, group, session,
-- mode ('register' at a hello | 'refresh' at a heartbeat)
-- A node id belongs to one group while registered; a refresh writes only over the
-- same stream's registration (its session). Returns {'yes'}, {'superseded'} or
-- {'other_group', group}.
-- The heartbeat time is the store's clock, kept beside the record (not inside it, so
-- the JSON is stored exactly as the server wrote it).
local P, id, group, session, mode = ARGV[1], ARGV[2], ARGV[6], ARGV[7], ARGV[8]
local key = P .. 'node:' .. id
local rec = redis.call('HGET', key, 'rec')
if rec then
  local cur = cjson.decode(rec)
  if type(cur.group) == 'string' and cur.group ~= group then
    return { 'other_group', cur.group }
  end
  local cur_session = cur.session
  if type(cur_session) ~= 'string' then
    cur_session = ''
  end
  if mode == 'refresh' and cur_session ~= session then
    return { 'superseded' }
  end
end
redis.call('HSET', key, 'rec', ARGV[3], 'inst', ARGV[4], 'hb', int(store_now_ms()))
redis.call('PEXPIRE', key, ARGV[5])
redis.call('SADD', P .. 'ids', id)
-- The runs leased to the node (beginlib.lua's lease_to) are kept while it beats.
redis.call('PEXPIRE', P .. 'busy:' .. id, BUSY_TTL_MS)
return { 'yes' }
