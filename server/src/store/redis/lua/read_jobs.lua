-- ARGV: P, job_id... Returns per job {rec|false, version|false, due|false, jit|false}
-- in one atomic step, so the record and its armed fire are from the same moment.
local P = ARGV[1]
local out = {}
for k = 2, #ARGV do
  local f = redis.call('HMGET', P .. 'job:' .. ARGV[k], 'rec', 'version', 'member', 'jit')
  local due = false
  if f[3] then
    due = redis.call('ZSCORE', P .. 'pending', f[3]) or false
  end
  out[#out + 1] = {f[1] or false, f[2] or false, due, f[4] or false}
end
return out
