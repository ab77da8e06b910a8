-- KEYS: B..'breaker:'..destination, B..'pace:'..destination and B..'wait:'..destination
-- (the {webhooks} slot).
-- ARGV: B (the breakers' prefix), destination, holder, limit, lease_ms, probe_ms,
-- wait_ms (how long an owner refused stays marked waiting).
-- Admits one delivery (`admit_slot`). Reply: {verdict, n}: 'go' (n: '1' when nothing is
-- counted on the breaker), 'probe' (this caller is the breaker's probe), 'open' (n:
-- until), 'full' (n: the window).
return admit_slot(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]),
  tonumber(ARGV[7]))
