-- ARGV: B (the breakers' prefix), destination, holder, answered ('1', '0', or '' for
-- no attempt), threshold, cool_down_ms, limit. Settles one delivery (`settle_slot`).
-- Reply: {state, until, changed (1/0)}, or {} when nothing was counted.
return settle_slot(ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
