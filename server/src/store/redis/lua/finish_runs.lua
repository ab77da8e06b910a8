-- ARGV: P, N, then 6 fields per result of a run of partition P: schedule_id,
-- 'holder' | 'waiting', token or attempt, outcome_json, node ('' for 'waiting'), the
-- lease in ms under which the webhook the result makes due is claimed for the caller
-- ('' for none: the delivery workers' sweep claims it).
-- KEYS: RedisStore::run_keys of each run; {'need', key...} when a job's serial queue
-- names runs not among them (see `want`), before anything is written.
-- finish_run of each, in order, in one step: finish_run's reply per result.
local P, N = ARGV[1], ARGV[2]
for i = 3, #ARGV, 6 do
  end_needs(P, job_of(ARGV[i]))
end
if asked then
  return needed()
end
local out = {}
for i = 3, #ARGV, 6 do
  out[#out + 1] = finish(P, N, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5])
end
return out
