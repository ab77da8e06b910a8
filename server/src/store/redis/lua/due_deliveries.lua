-- ARGV: P, limit. Outbox entries due by the store's clock (in flight ones whose claim
-- lease ran out included), earliest first.
return redis.call('ZRANGEBYSCORE', ARGV[1] .. 'outbox_due', '-inf', int(store_now_ms()), 'LIMIT', 0, tonumber(ARGV[2]))
