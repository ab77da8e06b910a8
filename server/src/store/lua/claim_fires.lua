-- ARGV: P, channel-unused, n, then per claim:
--   job_id, expected_due, expected_version, next_due|'', ntriggers, trigger_json...
-- (A job's jitter offset is fixed per version, so the next planned time is the next
-- due minus the offset already stored: a claim writes only the pending score.)
-- Each claim advances the job only if its pending score and version are the ones the
-- claimer saw and it is enabled; the next fire and the triggers are written together.
local P = ARGV[1]
local n = tonumber(ARGV[3])
local now = store_now_ms()
local pending = P .. 'pending'
local stream = P .. 'triggers'
local results = {}
local i = 4
for c = 1, n do
  local id, exp_due, exp_ver = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ndue, ntrig = ARGV[i + 3], tonumber(ARGV[i + 4])
  i = i + 5
  local job = P .. 'job:' .. id
  local f = redis.call('HMGET', job, 'version', 'paused')
  local score = redis.call('ZSCORE', pending, id)
  local r
  if not f[1] or f[2] == '1' then
    r = 'gone'
  elseif not score or tonumber(score) ~= tonumber(exp_due) then
    r = 'moved'
  elseif f[1] ~= exp_ver then
    r = 'version'
  else
    r = 'ok'
    if ndue ~= '' then
      redis.call('ZADD', pending, ndue, id)
    else
      redis.call('ZREM', pending, id)
    end
    for k = 0, ntrig - 1 do
      redis.call('XADD', stream, '*', 't', ARGV[i + k], 'at', int(now))
    end
  end
  i = i + ntrig
  results[c] = r
end
local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
return {int(now), results, first[2] or false}
