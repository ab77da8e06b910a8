-- ARGV: P, schedule_id, token, kind (delivered | retry | failed | gone | abandon | defer),
-- status, error, at (retry: delay ms; defer: due time ms). Records the outcome
-- (`finish_entry`). Reply: {applied, reason}.
return finish_entry(ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]))
