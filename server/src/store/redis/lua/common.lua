-- Shared prelude (prepended to every script). P is the partition's key prefix, e.g.
-- "sundial:{7}:", so every key a script touches lives in one cluster slot.

-- The store's clock, read once per script call: a script is one atomic step, so all
-- of it happens at one instant (and one TIME is a command, not two or three).
-- Its ms and µs are worked out once too (a script asks for them at every step of a
-- record: two string-to-number conversions a time cost more than the TIME did).
local store_time_reply, store_ms, store_us
local function store_time()
  if not store_time_reply then
    store_time_reply = redis.call('TIME')
    local s, us = tonumber(store_time_reply[1]), tonumber(store_time_reply[2])
    store_ms, store_us = s * 1000 + math.floor(us / 1000), s * 1000000 + us
  end
  return store_time_reply
end
local function store_now_ms()
  if not store_time_reply then
    store_time()
  end
  return store_ms
end
local function store_now_us()
  if not store_time_reply then
    store_time()
  end
  return store_us
end
-- A call declares in KEYS every key it touches (Redis Cluster redirects a call by them
-- while its slot moves between masters). The keys a script finds in its records (a
-- job's serial queue and active runs, a broadcast run's shards) its caller cannot
-- know: the script asks for them with `want` before it writes anything and, when one
-- was not declared, answers `needed()` ({'need', key...}) instead; the caller calls again
-- declaring them too (Call::invoke_declaring). These locals are set for each call by
-- its wrapper (functions.rs).
local call_keys, declared_set
-- The call declared only its first argument, its slot's prefix: on one Redis, where
-- no slot moves and a call need not declare its keys (Library::function), nothing is
-- asked for.
local prefix_only
-- The jobs whose serial queue a call found empty (`end_needs` in runlib.lua).
local empty_queues
-- While a result is applied for a caller that delivers its webhook itself (finish_runs):
-- the claim lease in ms the outbox entry is written with (`write_outbox` in
-- runlib.lua), and the entry so claimed. Nil otherwise (reset for each call too).
local claim_ms, claimed
-- The partition's fencing counter as this call's tokens left it, and its key (`new_token`
-- in runlib.lua): nil until the call makes a token; written when the call ends.
local token_key, token_last
-- The lease counts (SCARD of a node's busy set) this call read or changed, by the
-- set's key (`lease_to` and `take_slot` in beginlib.lua, `leave_busy` in runlib.lua):
-- a batch of begins leasing to a few nodes reads each count once. Nil until one is read.
local busy_counts
-- What the run scripts keep beside each run table they decoded (`info_of` in
-- runlib.lua), by table: a new one for each call.
local run_info = {}
local function declared(key)
  if prefix_only then
    return true
  end
  if not declared_set then
    declared_set = {}
    for _, k in ipairs(call_keys) do
      declared_set[k] = true
    end
  end
  return declared_set[key] == true
end
-- The keys this call asked for (`want`), nil while none: a list, and a set of them.
local asked
-- Asks for `key` (once) unless the call declared it.
local function want(key)
  if not declared(key) then
    if not asked then
      asked = {}
    end
    if not asked[key] then
      asked[key] = true
      asked[#asked + 1] = key
    end
  end
end
-- The reply asking for them: {'need', key...}.
local function needed()
  local out = { 'need' }
  for _, k in ipairs(asked) do
    out[#out + 1] = k
  end
  return out
end

-- Lua's tostring() prints 14 significant digits; µs tokens need all of theirs. A whole
-- number (all of them, in practice) is printed as an integer: half the cost of '%.0f',
-- which goes through the C library's float formatting.
local function int(n)
  if n % 1 == 0 and n > -9e15 and n < 9e15 then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end

-- The members of zset `key` scored at or before the store's now (at most `limit`,
-- earliest first) and the ms until the first one after them is due (0 when that one
-- is due too, false when there is none): {members, next_in|false}. With nothing due,
-- one ZRANGE (what an idle server's polls cost).
local function due_entries(key, limit)
  local now = store_now_ms()
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if not first[2] then
    return {{}, false}
  end
  if tonumber(first[2]) > now then
    return {{}, int(tonumber(first[2]) - now)}
  end
  local due = redis.call('ZRANGEBYSCORE', key, '-inf', int(now), 'LIMIT', 0, limit)
  local after = redis.call('ZRANGE', key, #due, #due, 'WITHSCORES')
  local next_in = false
  if after[2] then
    next_in = int(math.max(tonumber(after[2]) - now, 0))
  end
  return {due, next_in}
end
