-- ARGV: P, schedule_id, node, token, max_bytes, line_cost, then one JSON line each
-- ({time_ms, level, message, attempt}). Lines get their seq here; each counts its
-- message's bytes plus line_cost, and the oldest fall out past max_bytes. Only while
-- the run is DISPATCHED or RUNNING: a final log is never appended to. Returns '' when
-- stored, else the reason.
local P = ARGV[1]
local run, refused = reported_run(P, ARGV[2], ARGV[3], ARGV[4])
if refused then
  return refused
end
if not HELD[run.state] then
  return 'run is ' .. run.state
end
local sid = run.schedule_id
local runkey = P .. 'run:' .. sid
local lkey, mkey = P .. 'logs:' .. sid, P .. 'logmeta:' .. sid
local max, cost = tonumber(ARGV[5]), tonumber(ARGV[6])
local bytes = tonumber(redis.call('HGET', mkey, 'bytes') or '0')
for i = 7, #ARGV do
  local line = cjson.decode(ARGV[i])
  line.seq = redis.call('HINCRBY', mkey, 'seq', 1)
  bytes = bytes + #line.message + cost
  redis.call('RPUSH', lkey, cjson.encode(line))
end
while bytes > max do
  local old = redis.call('LPOP', lkey)
  if not old then
    bytes = 0
    break
  end
  bytes = bytes - #cjson.decode(old).message - cost
end
redis.call('HSET', mkey, 'bytes', bytes)
local ttl = redis.call('PTTL', runkey)
if ttl > 0 then
  redis.call('PEXPIRE', lkey, ttl)
  redis.call('PEXPIRE', mkey, ttl)
end
return ''
