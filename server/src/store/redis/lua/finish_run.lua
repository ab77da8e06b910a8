-- ARGV: P, N, schedule_id, 'holder' | 'waiting', token or attempt, outcome_json, the
-- holder's node ('' for 'waiting')
-- KEYS: RedisStore::run_keys of the run; {'need', key...} when its job's serial queue
-- names runs not among them (see `want`), before anything is written.
end_needs(ARGV[1], job_of(ARGV[3]))
if asked then
  return needed()
end
return finish(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], '')
