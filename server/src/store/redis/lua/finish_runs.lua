-- ARGV: P, N, then 5 fields per result of a run of partition P: schedule_id,
-- 'holder' | 'waiting', token or attempt, outcome_json, node ('' for 'waiting').
-- finish_run of each, in order, in one step: finish_run's reply per result.
local P, N = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV, 5 do
  out[#out + 1] = finish(P, N, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
return out
