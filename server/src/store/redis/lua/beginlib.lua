-- Beginning a run and leasing a WAITING run to a node (prepended, after runlib.lua, to
-- begin_run, assign_run and begin_and_assign, the scripts that make these decisions).

-- Leases the WAITING `run` to `node` at `now`: 'full' when the node already holds
-- `max` leased runs (0: no limit), else 'ok' with the run DISPATCHED under a new
-- fencing token, its lease and confirmation deadlines set, then the node's busy set
-- (false in a cluster) and its count as read (nil when not read), which the caller,
-- once it has written the run, hands to `take_slot`. Nothing is written here.
-- In a cluster N is '' and the caller reserved the node's slot beforehand
-- (node_slots.lua): `max` is 0 then, or -1 when there was none.
local function lease_to(P, N, run, node, max, ttl_ms, confirm_ms, now)
  local busy = N ~= '' and (N .. 'busy:' .. node)
  if max < 0 then
    return 'full'
  end
  local count
  if busy and max > 0 then
    -- A count this call read already (several runs of a batch leased to one node)
    -- is not read again: take_slot and leave_busy keep it true.
    count = busy_counts and busy_counts[busy]
    if count == nil then
      count = redis.call('SCARD', busy)
      busy_counts = busy_counts or {}
      busy_counts[busy] = count
    end
    if count >= max then
      return 'full'
    end
  end
  run.fencing_token = new_token(P)
  run.node_id = node
  run.state = 'DISPATCHED'
  run.reason = ''
  clear_deadlines(run)
  run.deadlines.lease_expires = now + ttl_ms
  run.deadlines.confirm_by = now + confirm_ms
  local timeout = tonumber(run.plan.timeout_ms) or 0
  if timeout > 0 then
    run.deadlines.timeout_at = now + timeout
  end
  return 'ok', busy, count
end

-- The node's count taken for run `sid`, which lease_to leased (`busy` and `count` as
-- it returned them).
local function take_slot(busy, sid, count)
  if busy then
    local added = redis.call('SADD', busy, sid)
    -- A new set gets its TTL here; one in use is kept by its node's heartbeats
    -- (upsert_node.lua), so a lease does not write it again.
    if count == nil or count == 0 then
      redis.call('PEXPIRE', busy, BUSY_TTL_MS)
    end
    -- (A count forgotten since lease_to read it stays forgotten.)
    local known = busy_counts and busy_counts[busy]
    if known then
      busy_counts[busy] = known + added
    end
  end
end

-- The runs of job `id` a begin under a policy other than allow looks at: the members
-- of its active set, and while the job hash says `plain` every run in its index too.
-- A run of an allow plan that begin_plain creates stays out of the active set (a set
-- made and dropped for every run, which only another policy ever reads), and marks the
-- job `plain` instead (once, while it is not); the first begin under another policy
-- then finds that job's runs still going in its index, adds them to the set and clears
-- the mark (`begin`), so the set again holds every run not final. (A policy change
-- reaches a run's plan, so this is the first begin after one; the index is bounded by
-- max_runs_per_job.) A job created over the index of a deleted one is marked too
-- (apply_jobs.lua): the runs of that one may still be going. Returns the schedule_ids,
-- a set of those that are members, and whether the index was read.
local function overlap_candidates(P, id)
  local sids = redis.call('SMEMBERS', P .. 'active:' .. id)
  local member = {}
  for _, a in ipairs(sids) do
    member[a] = true
  end
  if redis.call('HEXISTS', P .. 'job:' .. id, 'plain') == 0 then
    return sids, member, false
  end
  for _, a in ipairs(redis.call('ZRANGE', P .. 'runs:' .. id, 0, -1)) do
    if not member[a] then
      sids[#sids + 1] = a
    end
  end
  return sids, member, true
end

-- What beginning a run of job `id` under overlap `policy` may touch that its caller
-- cannot name (`want`): a policy other than allow looks at the job's runs not final
-- (overlap_candidates), and replace cancels them (their webhook entries and shards);
-- the index's oldest entries (index_needs, whose reading it returns).
local function begin_needs(P, id, policy, retention_ms, max_runs)
  if policy ~= 'allow' and not prefix_only then
    for _, a in ipairs((overlap_candidates(P, id))) do
      local key = P .. 'run:' .. a
      want(key)
      if policy == 'replace' then
        want(P .. 'delivery:' .. a)
        local r = declared(key) and load_run(P, a)
        for i = 0, (r and tonumber(r.shard_total) or 0) - 1 do
          want(key .. '#' .. i)
        end
      end
    end
  end
  return index_needs(P, id, retention_ms, max_runs)
end

-- begin's decision for the common run, made on the record as cmsgpack decodes it (as
-- start_run does a Started): a run of an allow job, existing and not paused, as the
-- server sends it (one map, no history), created WAITING to be routed (and leased
-- when `lease` says so). The same record, index, timer and reply as begin's, but the
-- run stays out of the job's active set (overlap_candidates); begin's reply for a run
-- already recorded (a trigger seen again: its record is written first, only if there
-- is none); nil, before anything is written, for every other case (begin decides
-- those, and finds a run already recorded).
local function begin_plain(P, N, id, sid, run_record, scheduled_at, retention_ms, max_runs, grace_ms, lease)
  local f = cmsgpack.unpack(run_record)
  if type(f) ~= 'table' or f.pl ~= nil or f.state == 'SKIPPED' or f.history ~= nil then
    return nil
  end
  local plan = f.plan
  if plan == nil then
    plan = {}
  elseif type(plan) ~= 'table' then
    return nil
  end
  setmetatable(plan, PLAN_MT)
  if plan.overlap ~= 'allow' then
    return nil
  end
  local head = index_needs(P, id, retention_ms, max_runs)
  if asked then
    return needed(), true
  end
  local job = redis.call('HMGET', P .. 'job:' .. id, 'version', 'paused', 'kept', 'plain')
  if not job[1] or job[2] == '1' then
    return nil
  end
  local now = store_now_ms()
  -- `np`: not in the job's active set (finish_succeeded then leaves the set and the
  -- serial queue alone); a begin that takes the run in clears it.
  f.created_at, f.state, f.reason, f.np = now, 'WAITING', nil, true
  f.deadlines = setmetatable({ wake_at = now + grace_ms,
    wait_until = now + (tonumber(plan.dispatch_wait_ms) or 0) }, DEADLINES_MT)
  local leased, busy, count
  if lease and f.deadlines.wake_at > 0 then
    leased, busy, count = lease(f, now)
  end
  -- The record as encode_run writes it (its plan's bytes after its fields, then its
  -- history: note_change's event for a new record).
  f.plan = nil
  local pb = next(plan) == nil and EMPTY_MAP or cmsgpack.pack(plan)
  f.pl, f.hn = #pb, 0
  local event = entered_event(f, now)
  local record = cmsgpack.pack(f) .. pb .. event
  -- Written first, and only when there is no record yet: a trigger seen again finds
  -- its run here (nothing else was written), so a new run costs no read of its key.
  local key = P .. 'run:' .. sid
  if not redis.call('SET', key, record, 'PX', retention_ms, 'NX') then
    return { '0', redis.call('GET', key), '' }, nil
  end
  if leased == 'ok' then
    take_slot(busy, sid, count)
  end
  local keep = keep_due(P, id, job[1], job[3], head, retention_ms, now, not job[4])
  local hint = index_run(P, N, id, sid, scheduled_at, retention_ms, max_runs, head, keep)
  local t = earliest(f.deadlines)
  if t > 0 then
    redis.call('ZADD', P .. 'timers', int(t), sid)
  end
  return { '1', record, hint }, leased
end

-- begin_run's decision for the run `run_record` (MessagePack) of job `id` (see
-- begin_run.lua). When the run is created WAITING to be routed now and `lease` is
-- given, `lease(run, now)` is asked before the run is written ('ok' when it leased
-- it, 'full' when not). Returns the reply {created, run record, index hint (see
-- index_new_run), then 5 fields per revoked lease} and what `lease` answered (nil
-- when it was not asked), or, before anything is written, {'need', key...} and true
-- (`want`).
local function begin(P, N, id, sid, run_record, scheduled_at, retention_ms, max_runs, grace_ms, lease)
  local out, leased = begin_plain(P, N, id, sid, run_record, scheduled_at, retention_ms, max_runs, grace_ms, lease)
  if out then
    return out, leased
  end
  local existing = redis.call('GET', P .. 'run:' .. sid)
  if existing then
    return { '0', existing, '' }, nil
  end
  local now = store_now_ms()
  local run = decode_run(run_record)
  local head = begin_needs(P, id, run.plan.overlap, retention_ms, max_runs)
  if asked then
    return needed(), true
  end
  clear_deadlines(run)
  run.created_at = now
  local job = redis.call('HMGET', P .. 'job:' .. id, 'version', 'paused', 'kept')
  local keep = keep_due(P, id, job[1], job[3], head, retention_ms, now)
  if run.state ~= 'SKIPPED' then
    if not job[1] then
      run.state, run.reason = 'SKIPPED', 'deleted'
    elseif job[2] == '1' then
      run.state, run.reason = 'SKIPPED', 'paused'
    end
  end
  local out = { '1', '' }
  if run.state ~= 'SKIPPED' then
    local akey = P .. 'active:' .. id
    local policy = run.plan.overlap
    local live = {}
    -- Only a policy other than allow looks at the job's other runs (each one a
    -- decode), and leaves every one still going in the set; allow adds this one to
    -- the set, which a serial queue consults.
    if policy ~= 'allow' then
      local sids, member, scanned = overlap_candidates(P, id)
      local taken_in = false
      for _, a in ipairs(sids) do
        local r = load_run(P, a)
        if r and not FINAL[r.state] then
          live[#live + 1] = r
          if not member[a] then
            redis.call('SADD', akey, a)
            taken_in = true
            if r.np then
              -- Its end must now leave the set, and release a serial queue behind it.
              r.np = nil
              save_run(P, r)
            end
          end
        elseif member[a] then
          redis.call('SREM', akey, a)
        end
      end
      if scanned then
        redis.call('HDEL', P .. 'job:' .. id, 'plain')
      end
      -- The set's TTL bounds what a lost member would keep.
      if taken_in then
        redis.call('PEXPIRE', akey, 2 * retention_ms)
      end
    end
    local wait_ms = tonumber(run.plan.dispatch_wait_ms) or 0
    if #live > 0 and policy == 'forbid' then
      run.state, run.reason = 'SKIPPED', 'overlap'
    elseif #live > 0 and policy == 'serial' then
      local qkey = P .. 'serial:' .. id
      if redis.call('LLEN', qkey) >= (tonumber(run.plan.serial_limit) or 0) then
        run.state, run.reason = 'SKIPPED', 'serial queue full'
      else
        run.state, run.reason = 'WAITING', 'queued'
        redis.call('RPUSH', qkey, sid)
        redis.call('PEXPIRE', qkey, retention_ms)
      end
    else
      if #live > 0 and policy == 'replace' then
        for _, r in ipairs(live) do
          local rvs = cancel_tree(P, N, r, 'replaced', now, false)
          save_run(P, r)
          for _, rv in ipairs(rvs) do
            for _, f in ipairs(rv) do
              out[#out + 1] = f
            end
          end
        end
      end
      run.state, run.reason = 'WAITING', ''
      run.deadlines.wake_at = now + grace_ms
      run.deadlines.wait_until = now + wait_ms
    end
    if run.state == 'WAITING' then
      redis.call('SADD', akey, sid)
      if keep then
        redis.call('PEXPIRE', akey, 2 * retention_ms)
      end
    end
  end
  if run.state == 'SKIPPED' then
    run.finished_at = now
  end
  local leased, busy, count
  if lease and run.state == 'WAITING' and run.deadlines.wake_at > 0 then
    leased, busy, count = lease(run, now)
  end
  local hint
  out[2], hint = index_new_run(P, N, run, scheduled_at, retention_ms, max_runs, head, keep)
  if leased == 'ok' then
    take_slot(busy, sid, count)
  end
  table.insert(out, 3, hint)
  local t = earliest(run.deadlines)
  if t > 0 and not FINAL[run.state] then
    redis.call('ZADD', P .. 'timers', int(t), sid)
  end
  return out, leased
end
