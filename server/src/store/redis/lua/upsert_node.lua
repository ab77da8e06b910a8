-- ARGV: P (the {nodes} prefix), node_id, record_json, instance, ttl_ms
-- The heartbeat time is the store's clock, kept beside the record (not inside it, so
-- the JSON is stored exactly as the server wrote it).
local P, id = ARGV[1], ARGV[2]
local key = P .. 'node:' .. id
redis.call('HSET', key, 'rec', ARGV[3], 'inst', ARGV[4], 'hb', int(store_now_ms()))
redis.call('PEXPIRE', key, ARGV[5])
redis.call('SADD', P .. 'ids', id)
return 1
