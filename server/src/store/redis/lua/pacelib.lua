-- A webhook destination's breaker and slots (prepended to every function after
-- beginlib.lua). Keys under B, the breakers' prefix (the {webhooks} slot):
-- breaker:<dest> (hash: state, until, failures, ramp), pace:<dest> (zset: holder →
-- its slot's lease end) and wait:<dest> (zset: owner refused a slot → end of its
-- waiting mark).

-- A holder's owner (an instance): its name up to its first '#', else all of it.
local function owner_of(holder)
  return string.match(holder, '^([^#]*)#') or holder
end

-- Whether `owner` yields to another owner marked waiting in `wkey` that holds fewer
-- than its share of `window` slots of `pkey` (the window over the owners holding or
-- waiting, rounded up), `owner` holding at least its share besides `holder`. With
-- nobody waiting, one command.
local function must_yield(pkey, wkey, owner, holder, window, now)
  local waiting = redis.call('ZRANGEBYSCORE', wkey, '(' .. int(now), '+inf')
  if #waiting == 0 or (#waiting == 1 and waiting[1] == owner) then
    return false
  end
  local held, owners = {}, 0
  local function count(o, n)
    if not held[o] then
      held[o] = 0
      owners = owners + 1
    end
    held[o] = held[o] + n
  end
  count(owner, 0)
  for _, w in ipairs(waiting) do
    count(w, 0)
  end
  for _, h in ipairs(redis.call('ZRANGEBYSCORE', pkey, '(' .. int(now), '+inf')) do
    count(owner_of(h), h == holder and 0 or 1)
  end
  local share = math.ceil(window / owners)
  if held[owner] < share then
    return false
  end
  for _, w in ipairs(waiting) do
    if w ~= owner and held[w] < share then
      return true
    end
  end
  return false
end

-- Admits `holder` to `dest` (see Outbox::admit_delivery): the breaker first, then a
-- slot among the window (`limit`, or the ramp while smaller; 1 for a probe) for
-- `lease` ms, shared fairly between owners while the breaker is closed (an owner
-- refused is marked waiting for `wait_ms`). Returns {verdict, n}: 'go' (n: '1' when
-- the breaker has no record, so nothing is counted on it, else '0'), 'probe' (this
-- caller is the breaker's probe), 'open' (n: until), 'full' (n: the window).
local function admit_slot(B, dest, holder, limit, lease, probe, wait_ms)
  local bkey = B .. 'breaker:' .. dest
  local pkey = B .. 'pace:' .. dest
  local wkey = B .. 'wait:' .. dest
  local owner = owner_of(holder)
  local function refuse(window)
    redis.call('ZADD', wkey, int(store_now_ms() + wait_ms), owner)
    redis.call('PEXPIRE', wkey, wait_ms)
    return { 'full', int(window) }
  end
  limit = math.max(1, limit)
  local b = redis.call('HMGET', bkey, 'state', 'until', 'ramp')
  local state, untl, ramp = b[1] or 'closed', tonumber(b[2]) or 0, tonumber(b[3])
  local now = store_now_ms()
  if state == 'open' and untl > now then
    return { 'open', int(untl) }
  end
  if state == 'half_open' and untl > now then
    -- Another caller's probe holds the only slot.
    return { 'full', '1' }
  end
  local window = limit
  if state ~= 'closed' then
    window = 1 -- the probe goes alone
  elseif ramp and ramp < window then
    window = ramp
  end
  local function full()
    return not redis.call('ZSCORE', pkey, holder) and redis.call('ZCARD', pkey) >= window
  end
  -- Slots whose lease ran out are dropped only when they would keep this one out.
  if full() then
    redis.call('ZREMRANGEBYSCORE', pkey, '-inf', now)
    if full() then
      return refuse(window)
    end
  end
  if state == 'closed' and must_yield(pkey, wkey, owner, holder, window, now) then
    redis.call('ZREM', pkey, holder)
    return refuse(window)
  end
  redis.call('ZADD', pkey, now + lease, holder)
  if redis.call('PTTL', pkey) < lease then
    redis.call('PEXPIRE', pkey, lease)
  end
  if state ~= 'closed' then
    redis.call('HSET', bkey, 'state', 'half_open', 'until', int(now + probe))
    redis.call('PEXPIRE', bkey, 86400000)
    return { 'probe', '0' }
  end
  return { 'go', (b[1] or b[2] or b[3]) and '0' or '1' }
end

-- Gives back `holder`'s slot of `dest` and counts the attempt on the breaker (see
-- Outbox::settle_delivery): `answered` '1', '0', or '' for no attempt. Returns
-- {state, until, changed (1/0)}, or {} when nothing was counted.
local function settle_slot(B, dest, holder, answered, threshold, cool_down, limit)
  local bkey = B .. 'breaker:' .. dest
  redis.call('ZREM', B .. 'pace:' .. dest, holder)
  if answered == '' then
    return {}
  end
  local b = redis.call('HMGET', bkey, 'state', 'until', 'failures', 'ramp')
  local state, untl, failures = b[1] or 'closed', tonumber(b[2]) or 0, tonumber(b[3]) or 0
  local ramp = tonumber(b[4])
  limit = math.max(1, limit)
  if answered == '1' then
    if state ~= 'closed' then
      -- Closed again: the window starts at one slot.
      ramp = 1
    elseif ramp then
      ramp = ramp + 1
    end
    if ramp and ramp < limit then
      redis.call('DEL', bkey)
      redis.call('HSET', bkey, 'state', 'closed', 'ramp', ramp)
      redis.call('PEXPIRE', bkey, 86400000)
    elseif b[1] or b[2] or b[3] or b[4] then
      -- A healthy destination has no record: nothing to delete.
      redis.call('DEL', bkey)
    end
    return { 'closed', '0', state ~= 'closed' and '1' or '0' }
  end
  if state == 'open' then
    return { 'open', int(untl), '0' }
  end
  local now = store_now_ms()
  failures = failures + 1
  if state == 'half_open' or failures >= threshold then
    untl = now + cool_down
    redis.call('HSET', bkey, 'state', 'open', 'until', int(untl), 'failures', failures)
    redis.call('HDEL', bkey, 'ramp')
    redis.call('PEXPIRE', bkey, 86400000)
    return { 'open', int(untl), '1' }
  end
  redis.call('HSET', bkey, 'state', 'closed', 'failures', failures)
  if ramp then
    redis.call('HSET', bkey, 'ramp', math.max(1, math.floor(ramp / 2)))
  end
  redis.call('PEXPIRE', bkey, 86400000)
  return { 'closed', '0', '0' }
end
