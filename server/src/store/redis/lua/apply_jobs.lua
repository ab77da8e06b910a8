-- Every job create and update (single ones are batches of one).
-- ARGV: P, channel, then 7 per write: kind ('c' create | 'u' update), job_id,
-- expected_version ('' for a create), record_json, paused(0|1), next_due|'', jitter_offset.
-- The pending member is "<version>:<jitter offset>:<job_id>", so a due-fires read needs
-- no per-job lookup and a claim's compare-and-set on the member's score checks the
-- version too; the job hash remembers its member so a change can remove it. An update
-- is one atomic version bump that replaces the member, so a claim computed from the old
-- definition can never re-arm it. A refused write (exists, notfound, conflict) leaves
-- the others applied. Returns 2 entries per write: the outcome ('ok', 'exists',
-- 'notfound', 'conflict') and the version (written, or current on a conflict; ''
-- otherwise). One PUBLISH for the whole batch. A create over the run index a deleted
-- job of the same id left is marked `plain`: its runs still going must count for the
-- new job's overlap policy (overlap_candidates in beginlib.lua).
-- KEYS: pending, jobs, then job:<id> and runs:<id> of each write.
local P, channel = ARGV[1], ARGV[2]
local out = {}
local changed = false
local n = (#ARGV - 2) / 7
for i = 0, n - 1 do
  local b = 2 + i * 7
  local kind, id, expected = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local rec, paused, due, jit = ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
  local job = P .. 'job:' .. id
  if kind == 'c' then
    if redis.call('EXISTS', job) == 1 then
      out[#out + 1] = 'exists'
      out[#out + 1] = ''
    else
      redis.call('HSET', job, 'rec', rec, 'version', '1', 'paused', paused, 'jit', jit)
      if redis.call('EXISTS', P .. 'runs:' .. id) == 1 then
        redis.call('HSET', job, 'plain', '1')
      end
      if due ~= '' then
        local member = '1:' .. jit .. ':' .. id
        redis.call('HSET', job, 'member', member)
        redis.call('ZADD', P .. 'pending', due, member)
      end
      redis.call('ZADD', P .. 'jobs', 0, id)
      out[#out + 1] = 'ok'
      out[#out + 1] = '1'
      changed = true
    end
  else
    local cur = redis.call('HMGET', job, 'version', 'member')
    if not cur[1] then
      out[#out + 1] = 'notfound'
      out[#out + 1] = ''
    elseif cur[1] ~= expected then
      out[#out + 1] = 'conflict'
      out[#out + 1] = cur[1]
    else
      local version = int(tonumber(cur[1]) + 1)
      if cur[2] then
        redis.call('ZREM', P .. 'pending', cur[2])
      end
      redis.call('HSET', job, 'rec', rec, 'version', version, 'paused', paused, 'jit', jit)
      if due ~= '' then
        local member = version .. ':' .. jit .. ':' .. id
        redis.call('HSET', job, 'member', member)
        redis.call('ZADD', P .. 'pending', due, member)
      else
        redis.call('HDEL', job, 'member')
      end
      out[#out + 1] = 'ok'
      out[#out + 1] = tostring(version)
      changed = true
    end
  end
end
if changed then
  redis.call('PUBLISH', channel, 'apply')
end
return out
