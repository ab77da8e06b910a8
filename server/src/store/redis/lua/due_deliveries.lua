-- KEYS: P..'outbox_due'. ARGV: limit. Outbox entries due by the store's clock (in
-- flight ones whose claim lease ran out included), earliest first, and the ms until the
-- partition's next entry falls due (0 when more are due than were returned, false when
-- there is none).
return due_entries(KEYS[1], tonumber(ARGV[1]))
