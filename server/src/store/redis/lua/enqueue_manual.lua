-- ARGV: P, job_id, schedule_id, trigger_json, idempotency_key|'', key_ttl_ms
local P, id, sid = ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', P .. 'job:' .. id) == 0 then
  return {'notfound'}
end
if ARGV[5] ~= '' then
  local key = P .. 'idem:' .. id .. ':' .. ARGV[5]
  local first = redis.call('GET', key)
  if first then
    return {'dup', first}
  end
  redis.call('SET', key, sid, 'PX', ARGV[6])
end
redis.call('XADD', P .. 'triggers', '*', 't', ARGV[4], 'at', int(store_now_ms()))
return {'ok', sid}
