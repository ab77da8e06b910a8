-- ARGV: P, N, schedule_id, 'holder' | 'waiting', token or attempt, outcome_json, the
-- holder's node ('' for 'waiting')
return finish(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
