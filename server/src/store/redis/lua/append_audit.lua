-- KEYS: the events (a sorted set of JSON by seq), the seq counter; one slot ({audit}).
-- ARGV: event_json, keep. Gives the event the next seq and the store's time, adds it,
-- and forgets the oldest past the newest `keep`. Returns the seq.
local event = cjson.decode(ARGV[1])
local seq = redis.call('INCR', KEYS[2])
event.seq = seq
event.time_ms = store_now_ms()
redis.call('ZADD', KEYS[1], seq, cjson.encode(event))
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[2])
if excess > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1)
end
return seq
