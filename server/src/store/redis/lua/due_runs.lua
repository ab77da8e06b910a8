-- KEYS: P..'timers'. ARGV: limit. Runs whose timer is due by the store's clock,
-- earliest first, and the ms until the partition's next timer falls due (0 when more
-- are due than were returned, false when there is none).
return due_entries(KEYS[1], tonumber(ARGV[1]))
