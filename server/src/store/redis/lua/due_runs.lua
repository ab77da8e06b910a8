-- ARGV: P, limit. Runs whose timer is due by the store's clock, earliest first.
return redis.call('ZRANGEBYSCORE', ARGV[1] .. 'timers', '-inf', int(store_now_ms()), 'LIMIT', 0, tonumber(ARGV[2]))
