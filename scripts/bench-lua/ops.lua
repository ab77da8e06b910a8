-- What the pieces of a run step cost alone: one command or cmsgpack call in a loop
-- (run by scripts/bench-lua.sh on its own, without the prelude). ARGV: iterations, op.
-- Each iteration makes a new key or member where the op writes, as a burst of new runs
-- does. Returns the ns per iteration.
local n, op = tonumber(ARGV[1]), ARGV[2]
local rec = cmsgpack.pack({
  schedule_id = 'j1@1796632560000', job_id = 'j1', schedule_no = '1796632560000',
  state = 'TRIGGERED', kind = 'CRON', attempt = 1, fencing_token = '0',
  scheduled_at = 1796632560000, triggered_at = 1796632560000, created_at = 1796632560000,
  job_version = 1, plan = { backoff_ms = 100, dispatch_wait_ms = 5000, serial_limit = 10 },
  deadlines = {},
})
local leased = {
  schedule_id = 'j1@1796632560000', job_id = 'j1', schedule_no = '1796632560000',
  state = 'DISPATCHED', kind = 'CRON', attempt = 1, fencing_token = '1796632560000123',
  scheduled_at = 1796632560000, triggered_at = 1796632560000, created_at = 1796632560000,
  job_version = 1, node_id = 'node-1', pl = 30, hn = 0,
  deadlines = { wake_at = 1, wait_until = 2, lease_expires = 3, confirm_by = 4 },
}
local ops = {
  empty = function() end,
  concat = function(i) return 'x:{0}:' .. 'run:' .. 'j' .. i .. '@1796632560000' end,
  get_miss = function(i) redis.call('GET', 'x:run:j' .. i) end,
  set_px_new = function(i) redis.call('SET', 'x:run:j' .. i, rec, 'PX', 604800000) end,
  zadd_new = function(i) redis.call('ZADD', 'x:timers', i, 'j' .. i .. '@1796632560000') end,
  sadd_new_set = function(i) redis.call('SADD', 'x:active:j' .. i, 'j' .. i .. '@1796632560000') end,
  hset = function(i) redis.call('HSET', 'x:tokens', 'j' .. i, 1796632560000123 + i) end,
  unpack_new = function() cmsgpack.unpack(rec) end,
  pack_leased = function() cmsgpack.pack(leased) end,
  time = function() redis.call('TIME') end,
}
local f = ops[op]
if not f then
  return redis.error_reply('unknown op ' .. op)
end
local t0 = redis.call('TIME')
for i = 1, n do
  f(i)
end
local t1 = redis.call('TIME')
return math.floor(((t1[1] - t0[1]) * 1e6 + (t1[2] - t0[2])) * 1000 / n)
