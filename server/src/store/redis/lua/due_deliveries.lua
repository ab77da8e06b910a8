-- ARGV: P, limit. Outbox entries due by the store's clock (in flight ones whose claim
-- lease ran out included), earliest first, and the ms until the partition's next entry
-- falls due (0 when more are due than were returned, false when there is none).
return due_entries(ARGV[1] .. 'outbox_due', tonumber(ARGV[2]))
