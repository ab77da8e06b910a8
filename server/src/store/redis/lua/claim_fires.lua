-- ARGV: P, unused, n, then per claim:
--   job_id, expected_due, expected_version, jitter_offset, next_due|'', ntriggers, trigger_json...
-- (jitter_offset: the claimed fire's due less its planned time, the same for the next
-- fire of the version: one member.)
-- Each claim advances the job only if its pending member (which names the version)
-- still has the score the claimer saw: the member exists only while the job is armed
-- and enabled at that version, so one ZSCORE is the whole compare-and-set. The next
-- fire (same member, new score) and the triggers are written in the same step.
local P = ARGV[1]
local n = tonumber(ARGV[3])
local now = store_now_ms()
local pending = P .. 'pending'
local stream = P .. 'triggers'
local results = {}
local i = 4
for c = 1, n do
  local id, exp_due, exp_ver = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local jit, ndue, ntrig = ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 5])
  i = i + 6
  local member = exp_ver .. ':' .. jit .. ':' .. id
  local score = redis.call('ZSCORE', pending, member)
  local r
  if score and tonumber(score) == tonumber(exp_due) then
    r = 'ok'
    if ndue ~= '' then
      redis.call('ZADD', pending, ndue, member)
    else
      redis.call('ZREM', pending, member)
      redis.call('HDEL', P .. 'job:' .. id, 'member')
    end
    for k = 0, ntrig - 1 do
      redis.call('XADD', stream, '*', 't', ARGV[i + k], 'at', int(now))
    end
  elseif score then
    r = 'moved'
  else
    -- Only on failure: tell a change of version from a pause or delete.
    local f = redis.call('HMGET', P .. 'job:' .. id, 'version', 'paused')
    if not f[1] or f[2] == '1' then
      r = 'gone'
    elseif f[1] ~= exp_ver then
      r = 'version'
    else
      r = 'moved'
    end
  end
  i = i + ntrig
  results[c] = r
end
local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
return {int(now), results, first[2] or false}
