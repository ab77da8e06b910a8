-- The run state machine's shared helpers (prepended to the run scripts after
-- common.lua). Keys of partition P: run:<sid> (the record, MessagePack), active:<job> (set of the
-- job's runs not final, but for the runs of allow plans begin_plain leaves out: see
-- beginlib.lua), serial:<job> (list: queued serial runs), timers (zset: sid →
-- earliest deadline), tokens (hash: '*' → the partition's fencing counter), logs:<sid> / logmeta:<sid>.
-- Node keys (prefix N, the {nodes} slot): busy:<node> (set of runs leased to it; in a
-- cluster N is '' and node_slots.lua keeps the count beside the scripts).
local FINAL = { SUCCEEDED = true, FAILED = true, TIMED_OUT = true, CANCELLED = true, SKIPPED = true }
local HELD = { DISPATCHED = true, RUNNING = true }
-- A node's busy set expires a day after it was created or its node last beat.
local BUSY_TTL_MS = 86400000

-- A stored record leaves out every field that holds its default (RunRecord's
-- `skip_serializing_if` in model.rs, the same fields and values): a new record is about
-- half the elements, which every step decodes and encodes. A decoded record reads them
-- back through these metatables; a step that sets one writes it again.
local RUN_DEFAULTS = {
  node_id = '', error_code = '', error_message = '', reason = '', last_node = '',
  progress_percent = 0, progress_message = '', shard_index = 0, shard_total = 0,
  parent = '', shards_done = 0, shards_succeeded = 0, callback_state = 'NONE',
  callback_attempts = 0, callback_status = 0, callback_error = '',
}
-- RunPlan::default().
local PLAN_DEFAULTS = {
  max_attempts = 1, backoff_ms = 1000, backoff_multiplier = 1, max_backoff_ms = 60000,
  timeout_ms = 0, overlap = 'allow', serial_limit = 100, dispatch_wait_ms = 30000,
}
local PLAN_MT = { __index = PLAN_DEFAULTS }
-- A deadline not set reads as 0 (a table, not a function: no call per lookup).
local DEADLINES_MT = {
  __index = { lease_expires = 0, confirm_by = 0, timeout_at = 0, wake_at = 0, wait_until = 0 },
}
-- An empty plan (every field at its default) as a MessagePack map: cmsgpack writes an
-- empty table as an array.
local EMPTY_MAP = '\128'

-- Run records are MessagePack (`cmsgpack`: about half the cost of cjson to decode and
-- encode, and integers stay exact); a record written before they were is JSON, and
-- starts with '{', which no MessagePack map does. JSON nulls decode as cjson.null,
-- which cmsgpack writes as nil (the key then absent, as a MessagePack nil decodes).
-- Deadlines are numbers (0: not set) once decoded.
--
-- The scripts write a record as three parts back to back (schema 4, see
-- `SCHEMA_VERSION` and `decode_run` in mod.rs): the run's fields (a map, with `pl`, the
-- plan's length in bytes, and `hn`, how many history events follow), its plan (a map),
-- then its history's events (arrays, oldest first). A step decodes the fields alone,
-- and keeps the bytes it read (see info_of): the plan is cut out and decoded when a step
-- reads `run.plan`, the history never (a change's event is packed and kept; saving
-- writes the fields, then the plan and the events as read, then the new events, the
-- oldest falling out past 32). Decoding a whole record cost cmsgpack about 6.6 µs (the
-- plan 1.9, three events 2.6: a table each) and encoding it 6 µs, at every step. A
-- record of one map (schema 3, or written by the server: begin_run, record_run) holds
-- its plan and history inside, and is read as it is (its plan as a table, its events
-- as the bytes they are written as).
--
-- What a run table holds besides the record's fields is kept beside it, by table, in
-- `run_info` (common.lua: a new table for each call), since a key added to the table
-- cmsgpack made would make Lua grow it, and saving would have to take it out again:
-- `raw` (the bytes read), `off` (where its fields end), `pb` (the plan's bytes once
-- cut out), `ev` (the events' bytes when they replaced those read, or for a record of
-- one map), `add` (events added since), `before` (what the record was when loaded:
-- mark_of).
local function info_of(run)
  local i = run_info[run]
  if not i then
    i = {}
    run_info[run] = i
  end
  return i
end

-- The plan's bytes as read (nil for a record of one map).
local function plan_bytes(run, i)
  local pb = i.pb
  if not pb and i.raw then
    pb = string.sub(i.raw, i.off + 1, i.off + run.pl)
    i.pb = pb
  end
  return pb
end

local RUN_MT = {
  __index = function(run, k)
    if k ~= 'plan' then
      return RUN_DEFAULTS[k]
    end
    local pb = plan_bytes(run, info_of(run))
    local plan = pb and cmsgpack.unpack(pb)
    if type(plan) ~= 'table' then
      plan = {}
    end
    setmetatable(plan, PLAN_MT)
    rawset(run, 'plan', plan)
    return plan
  end,
}

-- A record of one map: its history's events as they are written after the fields.
local function inline_history(run, i)
  local h = run.history
  run.history = nil
  local ev, n = {}, 0
  if type(h) == 'table' then
    for _, e in ipairs(h) do
      if type(e) == 'table' and e[1] == nil then
        -- JSON: an event as a map ({at, what, attempt, node_id, detail}).
        e = { e.at, e.what, e.attempt, e.node_id or '', e.detail or '' }
      end
      n = n + 1
      ev[n] = cmsgpack.pack(e)
    end
  end
  i.ev, run.hn = table.concat(ev), n
end

local function decode_run(bytes)
  local run, raw
  if string.byte(bytes, 1) == 123 then
    run = cjson.decode(bytes)
  else
    local off
    off, run = cmsgpack.unpack_one(bytes, 0)
    if off > 0 and tonumber(run.pl) then
      run_info[run] = { raw = bytes, off = off }
      raw = true
    end
  end
  if not raw then
    run.pl = nil
    inline_history(run, info_of(run))
    if type(run.plan) == 'table' then
      setmetatable(run.plan, PLAN_MT)
    else
      run.plan = nil
    end
  end
  local d = run.deadlines
  if type(d) ~= 'table' then
    d = {}
    run.deadlines = d
  elseif not raw then
    -- JSON: a deadline may be null or a float.
    for k, v in pairs(d) do
      d[k] = tonumber(v) or 0
    end
  end
  setmetatable(d, DEADLINES_MT)
  return setmetatable(run, RUN_MT)
end

-- The events' bytes as read, or as they replaced those (nil for a new record).
local function events_read(run, i)
  local ev = i.ev
  if not ev and i.raw then
    ev = string.sub(i.raw, i.off + run.pl + 1)
  end
  return ev
end

-- The record's history events as bytes, all of them (read, then added).
local function history_bytes(run)
  local i = info_of(run)
  return (events_read(run, i) or '') .. (i.add or '')
end

-- The run's history, emptied (a new record made from another's: fan_out.lua).
local function clear_history(run)
  local i = info_of(run)
  i.ev, i.add, run.hn = '', nil, 0
end

-- The record's bytes (see decode_run). No step changes a run's plan: the plan's bytes
-- as read are written back, not the plan re-encoded.
local function encode_run(run)
  local i = info_of(run)
  local plan = rawget(run, 'plan')
  if plan then
    run.plan = nil
  end
  local tail
  if i.raw and not i.ev then
    -- The plan and the events as read (`pl` as read).
    tail = string.sub(i.raw, i.off + 1)
  else
    local pb = plan_bytes(run, i)
    if not pb then
      pb = (not plan or next(plan) == nil) and EMPTY_MAP or cmsgpack.pack(plan)
      i.pb = pb
    end
    local ev = events_read(run, i) or ''
    run.pl = #pb
    tail = pb .. ev
  end
  local bytes = cmsgpack.pack(run) .. tail .. (i.add or '')
  if plan then
    run.plan = plan
  end
  return bytes
end

local function text(v)
  if type(v) == 'string' then
    return v
  end
  return ''
end

-- What a run's history notes a change of: {state, attempt, node, webhook attempts}
-- (RunRecord::mark in Rust).
local function mark_of(run)
  return { text(run.state), tonumber(run.attempt) or 0, text(run.node_id), tonumber(run.callback_attempts) or 0 }
end

-- What a history's WEBHOOK event says of a delivery attempt: its HTTP status (0: no
-- answer) and error.
local function webhook_detail(status, err)
  local detail = status == 0 and 'no answer' or ('HTTP ' .. string.format('%d', status))
  if err ~= '' then
    detail = detail .. ': ' .. err
  end
  return detail
end

-- Events `ev` (`n` of them, as MessagePack arrays back to back) with `event` (an
-- array [at, what, attempt, node_id, detail]: RunEvent's fields in order, half the
-- MessagePack of a map, decoded by position) after them, the last 32 kept; and how
-- many that is.
local function append_event(ev, n, event)
  ev, n = (ev or '') .. cmsgpack.pack(event), (tonumber(n) or 0) + 1
  while n > 32 do
    ev = string.sub(ev, cmsgpack.unpack_one(ev, 0) + 1)
    n = n - 1
  end
  return ev, n
end

-- The detail of the event noting that run `r` (a run table or a record's decoded
-- fields) entered `state`: its error when it ended with one, else its reason.
local function entered_detail(r, state)
  local code = FINAL[state] and text(r.error_code) or ''
  if code ~= '' then
    local msg = text(r.error_message)
    return msg == '' and code or (code .. ': ' .. msg)
  end
  return text(r.reason)
end

-- The event (packed) noting that a record's decoded fields `f` entered their state
-- (note_change's for a state entered), counted in `hn`: what a step decided on
-- decoded fields writes after the record's other bytes.
local function entered_event(f, now)
  f.hn = (tonumber(f.hn) or 0) + 1
  return cmsgpack.pack({ now, f.state, tonumber(f.attempt) or 0, text(f.node_id), entered_detail(f, f.state) })
end

-- Notes in run.history what changed since the record was loaded (or that it is new):
-- a webhook attempt when only the webhook's attempts changed, else the state entered;
-- the last 32 steps are kept. RunRecord::note_change in Rust is the same rule.
local function note_change(run)
  local i = info_of(run)
  local b = i.before
  local state, attempt = text(run.state), tonumber(run.attempt) or 0
  local node, cbs = text(run.node_id), tonumber(run.callback_attempts) or 0
  if b and b[1] == state and b[2] == attempt and b[3] == node and b[4] == cbs then
    return
  end
  local what, detail
  if b and b[4] ~= cbs and b[1] == state and b[2] == attempt and b[3] == node then
    what, detail = 'WEBHOOK', webhook_detail(tonumber(run.callback_status) or 0, text(run.callback_error))
  else
    what, detail = state, entered_detail(run, state)
  end
  local event = { store_now_ms(), what, attempt, node, detail }
  local n = (tonumber(rawget(run, 'hn')) or 0) + 1
  if n > 32 then
    i.ev, run.hn = append_event(history_bytes(run), n - 1, event)
    i.add = nil
  else
    i.add, run.hn = (i.add or '') .. cmsgpack.pack(event), n
  end
  if b then
    b[1], b[2], b[3], b[4] = state, attempt, node, cbs
  else
    i.before = { state, attempt, node, cbs }
  end
end

local function load_run(P, sid)
  local j = redis.call('GET', P .. 'run:' .. sid)
  if not j then
    return nil
  end
  local run = decode_run(j)
  info_of(run).before = mark_of(run)
  return run
end

-- The run an executor's message names: shard 0 of a fanned-out broadcast run travels
-- under the parent's schedule_id.
local function load_held(P, sid)
  local run = load_run(P, sid)
  if run and (run.parent == nil or run.parent == '') and (tonumber(run.shard_total) or 0) > 0 then
    return load_run(P, sid .. '#0')
  end
  return run
end

-- Why a report from `node` under `token` is refused, or nil (Holder::refusal in Rust):
-- the node is compared first, so a stream naming another node's run learns nothing of
-- its token; the previous lease's node gets 'stale fencing token' for a late report.
local function holder_refusal(run, node, token)
  if (run.node_id or '') ~= node then
    if (run.last_node or '') == node then
      return 'stale fencing token'
    end
    return 'not the lease holder'
  end
  if run.fencing_token ~= token then
    return 'stale fencing token'
  end
  return nil
end

-- The run an executor's report names, and why the report is refused if it is
-- ('unknown run', or holder_refusal).
local function reported_run(P, sid, node, token)
  local run = load_held(P, sid)
  if not run then
    return nil, 'unknown run'
  end
  return run, holder_refusal(run, node, token)
end

-- The run a progress or log report names while it may still take one (DISPATCHED or
-- RUNNING, by its lease holder), else nil and why not.
local function held_run(P, sid, node, token)
  local run, refused = reported_run(P, sid, node, token)
  if refused then
    return nil, refused
  end
  if not HELD[run.state] then
    return nil, 'run is ' .. run.state
  end
  return run
end

-- The earliest deadline set (0: none); a deadline not set reads as 0, or is absent
-- from a record's deadlines as cmsgpack decodes them (start_run).
local function earliest(d)
  local m = d.lease_expires or 0
  if m < 0 then
    m = 0
  end
  local v = d.confirm_by or 0
  if v > 0 and (m == 0 or v < m) then
    m = v
  end
  v = d.timeout_at or 0
  if v > 0 and (m == 0 or v < m) then
    m = v
  end
  v = d.wake_at or 0
  if v > 0 and (m == 0 or v < m) then
    m = v
  end
  return m
end

-- Writes the record back (keeping its retention TTL), its history noting what
-- changed, and re-scores its timer. A run that was final when loaded has no timer
-- (the step that made it final took it out, and a final run is never given one), so
-- a later change of it (its webhook's outcome) leaves the timers alone.
-- A run's timer is never later than its earliest deadline, and may be earlier (the
-- sweeper then finds nothing due and re-scores it: expire_run.lua). With `timer_by`,
-- the earliest deadline when the run was loaded, a step whose change only moves that
-- deadline later (a `Started` clearing confirm_by) leaves the timer where it is: one
-- ZADD fewer per run, and a sweep of it only if it outlasts the earlier deadline.
local function save_run(P, run, timer_by)
  local before = info_of(run).before
  local was_final = before and FINAL[before[1]]
  note_change(run)
  local json = encode_run(run)
  redis.call('SET', P .. 'run:' .. run.schedule_id, json, 'KEEPTTL')
  local t = earliest(run.deadlines)
  if t > 0 and not FINAL[run.state] then
    if not (timer_by and timer_by > 0 and t >= timer_by) then
      redis.call('ZADD', P .. 'timers', int(t), run.schedule_id)
    end
  elseif not was_final then
    redis.call('ZREM', P .. 'timers', run.schedule_id)
  end
  return json
end

-- An executor's `Started` for run `sid` under `token`: DISPATCHED → RUNNING (the
-- store's now as started_at, confirm_by cleared), saved. Returns the answer ('yes',
-- 'already' when RUNNING under the same lease, 'no'), the reason of a 'no', and the
-- run (nil when there is none) with, when 'yes', its record as written.
local function start_held(P, sid, node, token)
  local run, refused = reported_run(P, sid, node, token)
  if not run or refused then
    return 'no', refused, run
  end
  if run.state == 'RUNNING' then
    return 'already', '', run
  end
  if run.state ~= 'DISPATCHED' then
    return 'no', 'run is ' .. run.state, run
  end
  local timer_by = earliest(run.deadlines)
  run.state = 'RUNNING'
  run.started_at = store_now_ms()
  run.deadlines.confirm_by = 0
  return 'yes', '', run, save_run(P, run, timer_by)
end

-- The record of run `sid` for a step decided on its decoded fields: its key, its
-- bytes, where its fields end and the fields; only the key and the bytes (nil when
-- there is no record) when it is not of three parts or its history is full (the
-- oldest event would fall out), which the general way takes.
local function read_fields(P, sid)
  local key = P .. 'run:' .. sid
  local bytes = redis.call('GET', key)
  if not bytes or string.byte(bytes, 1) == 123 then
    return key, bytes
  end
  local off, f = cmsgpack.unpack_one(bytes, 0)
  if type(f) ~= 'table' or off <= 0 or not tonumber(f.pl) or (tonumber(f.hn) or 0) >= 32 then
    return key, bytes
  end
  return key, bytes, off, f
end

-- Writes back a record read_fields read, its fields `f` as the step left them, the
-- plan and events as read, then the event of the state entered (keeping its TTL).
-- Returns the record as written.
local function write_fields(key, f, bytes, off, now)
  local event = entered_event(f, now)
  local record = cmsgpack.pack(f) .. string.sub(bytes, off + 1) .. event
  redis.call('SET', key, record, 'KEEPTTL')
  return record
end

-- start_held's decision, made on the record's fields as cmsgpack decodes them: no
-- run table, no side table, no plan (a `Started` is the step every run takes, and the
-- one that reads least). The record's bytes after its fields are written back as they
-- were, its event after them; the same answer, record and timer as start_held. A
-- record that is not of three parts, a broadcast run (its shard 0 answers) or one with
-- a full history (the oldest event falls out) takes start_held's way. Returns the
-- answer, the reason of a 'no', nil, and the record as it stands after the step.
local function start_run(P, sid, node, token)
  local key, bytes, off, f = read_fields(P, sid)
  if not bytes then
    return 'no', 'unknown run'
  end
  if not f or ((tonumber(f.shard_total) or 0) > 0 and (f.parent or '') == '') then
    local answer, reason, run, record = start_held(P, sid, node, token)
    return answer, reason, nil, record or (run and encode_run(run))
  end
  local refused = holder_refusal(f, node, token)
  if refused then
    return 'no', refused, nil, bytes
  end
  if f.state == 'RUNNING' then
    return 'already', '', nil, bytes
  end
  if f.state ~= 'DISPATCHED' then
    return 'no', 'run is ' .. f.state, nil, bytes
  end
  local d = type(f.deadlines) == 'table' and f.deadlines or {}
  f.deadlines = d
  local timer_by = earliest(d)
  local now = store_now_ms()
  f.state, f.started_at, d.confirm_by = 'RUNNING', now, nil
  local record = write_fields(key, f, bytes, off, now)
  local t = earliest(d)
  if t > 0 and not (timer_by > 0 and t >= timer_by) then
    redis.call('ZADD', P .. 'timers', int(t), sid)
  end
  return 'yes', '', nil, record
end

-- Every deadline unset (0; left out of the record until one is set).
local function clear_deadlines(run)
  run.deadlines = setmetatable({}, DEADLINES_MT)
end

-- A new fencing token for a lease of a run of partition P: max(counter + 1, store
-- time in µs), the counter being the partition's last token (DESIGN's job counter,
-- shared by the partition's jobs: a token still grows at every lease of a job, and one
-- read and one write serve a call's every lease). The counter is read at the call's
-- first token (`token_last`, common.lua) and written once when the call ends
-- (`save_tokens`, called by its wrapper). A partition whose tokens hash still holds
-- the per-job counters of before takes their largest, and drops them.
local function new_token(P)
  local last = token_last
  if not last then
    token_key = P .. 'tokens'
    last = tonumber(redis.call('HGET', token_key, '*'))
    if not last then
      last = 0
      for _, v in ipairs(redis.call('HVALS', token_key)) do
        last = math.max(last, tonumber(v) or 0)
      end
      if last > 0 then
        redis.call('DEL', token_key)
      end
    end
  end
  token_last = math.max(last + 1, store_now_us())
  return int(token_last)
end

-- Writes the partition's fencing counter as the call's tokens left it (the wrapper of
-- every function calls it at the end of a call that made one).
local function save_tokens()
  redis.call('HSET', token_key, '*', int(token_last))
end

-- Run `sid` leaves the node's busy set `key`: the count this call may remember for it
-- is forgotten (read again if a lease asks).
local function leave_busy(key, sid)
  redis.call('SREM', key, sid)
  if busy_counts then
    busy_counts[key] = nil
  end
end

-- The run leaves DISPATCHED/RUNNING: its node's lease count drops (in a cluster, N is
-- '' and the caller releases the node's slot: node_slots.lua).
local function leave_node(N, run)
  if N ~= '' and HELD[run.state] and run.node_id ~= '' then
    leave_busy(N .. 'busy:' .. run.node_id, run.schedule_id)
  end
end

-- Takes the lease away: a new token makes the holder's stale. Returns the revocation
-- {sid, node, old token, reason}, or nil when the run held no lease.
local function revoke(P, N, run, reason)
  if not HELD[run.state] or run.node_id == '' then
    return nil
  end
  local rv = { run.schedule_id, run.node_id, run.fencing_token, reason, tostring(run.attempt) }
  leave_node(N, run)
  run.fencing_token = new_token(P)
  return rv
end

-- A dispatch nothing confirmed goes back to WAITING at the same attempt (reason
-- 'unconfirmed'): it may never have reached its node, so the attempt is not spent.
-- Returns the revocation; the caller saves the run.
local function unconfirmed(P, N, run, now)
  local rv = revoke(P, N, run, 'unconfirmed')
  run.last_node = run.node_id
  run.state, run.reason = 'WAITING', 'unconfirmed'
  local wait_ms = tonumber(run.plan.dispatch_wait_ms) or 0
  clear_deadlines(run)
  run.deadlines.wake_at, run.deadlines.wait_until = now, now + wait_ms
  return rv
end

-- The next queued serial run becomes due to route; returns its sid.
local function pop_serial(P, job_id, now)
  while true do
    local nxt = redis.call('LPOP', P .. 'serial:' .. job_id)
    if not nxt then
      return nil
    end
    local r = load_run(P, nxt)
    if r and r.state == 'WAITING' then
      r.deadlines.wake_at = now
      r.deadlines.wait_until = now + (tonumber(r.plan.dispatch_wait_ms) or 0)
      r.reason = ''
      save_run(P, r)
      return nxt
    end
  end
end

-- Whether the job still has an active run that is not waiting in its serial queue
-- (one leased, or waiting to be routed): the queue must not pop while it does.
local function has_unqueued_active(P, job_id)
  for _, a in ipairs(redis.call('SMEMBERS', P .. 'active:' .. job_id)) do
    local r = load_run(P, a)
    if r and (HELD[r.state] or (r.state == 'WAITING' and r.deadlines.wake_at > 0)) then
      return true
    end
  end
  return false
end

-- What the end of a run of `job_id` may read that its caller cannot name (`want`):
-- while the job has a serial queue, each queued run and each of its active runs (a
-- pop looks at them). A queue found empty is remembered for the rest of the call.
-- Nothing on one Redis (`prefix_only`: nothing is asked for there).
local function end_needs(P, job_id)
  if prefix_only or not job_id or (empty_queues and empty_queues[job_id]) then
    return
  end
  local queue = P .. 'serial:' .. job_id
  if redis.call('LLEN', queue) == 0 then
    empty_queues = empty_queues or {}
    empty_queues[job_id] = true
    return
  end
  for _, s in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    want(P .. 'run:' .. s)
  end
  for _, a in ipairs(redis.call('SMEMBERS', P .. 'active:' .. job_id)) do
    want(P .. 'run:' .. a)
  end
end

-- The job a schedule_id names ("<job_id>@<schedule no>").
local function job_of(sid)
  local at = string.find(sid, '@', 1, true)
  return at and at > 1 and string.sub(sid, 1, at - 1) or nil
end

-- A webhook's outbox entry is the hash delivery:<sid> (job_id, url, body, created_at,
-- attempts, token, in_flight '1' | '0', due, ra, rn; and its outcomes: see
-- finish_entry), so a claim or an outcome reads and writes the fields it needs and never
-- decodes or re-encodes the body; outbox_due: sid -> when it is due, or while in flight
-- when its claim lease ends. An entry written before (outbox:<sid>, one JSON document)
-- is moved into the hash when it is first read.
local function move_legacy_delivery(P, sid, key)
  local legacy = P .. 'outbox:' .. sid
  local j = redis.call('GET', legacy)
  if not j then
    return false
  end
  local e = cjson.decode(j)
  redis.call('DEL', legacy)
  redis.call('HSET', key, 'job_id', e.job_id, 'url', e.url, 'body', e.body,
    'created_at', int(tonumber(e.created_at) or 0), 'attempts', int(tonumber(e.attempts) or 0),
    'token', tostring(e.token), 'in_flight', e.in_flight == true and '1' or '0',
    'due', int(tonumber(e.due) or 0))
  return true
end

-- The entry's `fields` (the first one 'token', which every entry has): the key and
-- the values, or the key and nil when there is no entry.
local function read_delivery(P, sid, fields)
  local key = P .. 'delivery:' .. sid
  local f = redis.call('HMGET', key, unpack(fields))
  if f[1] then
    return key, f
  end
  if not move_legacy_delivery(P, sid, key) then
    return key, nil
  end
  return key, redis.call('HMGET', key, unpack(fields))
end

-- Claims the entry of `sid` if it is due by the store's clock: in flight under a new
-- delivery token until now + `lease` ms. nil when it is not due or gone (a member of
-- outbox_due without its entry is dropped), else {job_id, url, body, attempts,
-- created_at, token}.
local function claim_entry(P, sid, lease)
  local key, f = read_delivery(P, sid, { 'token', 'due', 'job_id', 'url', 'body', 'attempts', 'created_at' })
  if not f then
    redis.call('ZREM', P .. 'outbox_due', sid)
    return nil
  end
  local now = store_now_ms()
  if tonumber(f[2]) > now then
    return nil
  end
  -- Tokens only grow: max(last + 1, store time in µs), as fencing tokens do.
  local token = int(math.max(tonumber(f[1]) + 1, store_now_us()))
  local due = int(now + lease)
  redis.call('HSET', key, 'token', token, 'in_flight', '1', 'due', due)
  redis.call('ZADD', P .. 'outbox_due', due, sid)
  return { f[3], f[4], f[5], f[6], f[7], token }
end

-- An entry written before outcomes were kept on it (no `ra`): the outcome is written
-- into the run's record, as it was then.
local function outcome_on_run(P, sid, kind, status, err, attempts)
  local run = load_run(P, sid)
  if run then
    run.callback_attempts = attempts
    run.callback_status = status
    run.callback_error = err
    if kind ~= 'retry' then
      run.callback_state = kind == 'delivered' and 'DONE' or 'FAILED'
    end
    save_run(P, run)
  end
end

-- Records a delivery attempt's outcome if `token` is the entry's current token and it
-- is in flight: `kind` delivered | retry | failed | gone | abandon | defer, `status`,
-- `err`, `at` (retry: the delay in ms; defer: when it is due again). Every kind but
-- defer and abandon counts an attempt, and notes it (a WEBHOOK event, as
-- note_change would write it on the run); the four final ones take the entry out of
-- outbox_due. Returns {'yes', ''} or {'no', reason}.
-- The outcomes are kept on the entry, not in the run's record (its final state never
-- changes again, so rewriting it for its webhook cost a decode, an encode and two
-- commands per outcome): `attempts`, `status`, `error`, `ev` and `hn` (the events, as a
-- record's), and `done` ('DONE' | 'FAILED') once final, when the entry drops its url
-- and body and lives as long as the run's record. Readers lay them over the record
-- (`overlay_outcome` in mod.rs); a done entry is no delivery ('unknown delivery').
local function finish_entry(P, sid, token, kind, status, err, at)
  local key, f = read_delivery(P, sid,
    { 'token', 'in_flight', 'attempts', 'ra', 'rn', 'ev', 'hn', 'done' })
  if not f or f[8] then
    return { 'no', 'unknown delivery' }
  end
  if f[1] ~= token or f[2] ~= '1' then
    return { 'no', 'stale delivery token' }
  end
  local now = store_now_ms()
  if kind == 'defer' then
    local due = int(math.max(now, at))
    redis.call('HSET', key, 'in_flight', '0', 'due', due)
    redis.call('ZADD', P .. 'outbox_due', due, sid)
    return { 'yes', '' }
  end
  local attempts = tonumber(f[3]) or 0
  if kind ~= 'abandon' then
    attempts = attempts + 1
  end
  -- (HMGET gives false for a field the entry does not have.)
  local kept = f[4] and true or false
  if not kept then
    outcome_on_run(P, sid, kind, status, err, attempts)
  end
  local fields = { 'attempts', int(attempts) }
  if kept then
    fields[3], fields[4], fields[5], fields[6] = 'status', int(status), 'error', err
    if kind ~= 'abandon' then
      local ev, n = append_event(f[6] or '', f[7],
        { now, 'WEBHOOK', tonumber(f[4]) or 0, f[5] or '', webhook_detail(status, err) })
      fields[7], fields[8], fields[9], fields[10] = 'ev', ev, 'hn', int(n)
    end
  end
  if kind == 'retry' then
    local due = int(now + at)
    redis.call('HSET', key, 'in_flight', '0', 'due', due, unpack(fields))
    redis.call('ZADD', P .. 'outbox_due', due, sid)
    return { 'yes', '' }
  end
  redis.call('ZREM', P .. 'outbox_due', sid)
  -- (The record's expiry itself, not its PTTL: a PTTL read and a PEXPIRE in one script
  -- can see clocks a millisecond apart.)
  local expires = kept and redis.call('PEXPIRETIME', P .. 'run:' .. sid) or -2
  if expires > 0 then
    redis.call('HSET', key, 'done', kind == 'delivered' and 'DONE' or 'FAILED', 'in_flight', '0',
      unpack(fields))
    redis.call('HDEL', key, 'url', 'body')
    redis.call('PEXPIREAT', key, expires)
  else
    redis.call('DEL', key)
  end
  return { 'yes', '' }
end

-- The run's webhook: when its plan names a callback URL (`url`), the step that makes it
-- final writes its outbox entry with the body fixed now, due now; or, while a result is
-- applied for a caller that delivers it (`claim_ms`), claimed at once for that
-- caller, as claim_entry would (in flight under a new token until now + claim_ms),
-- the claim kept in `claimed` for the reply (see `reply`).
local function write_outbox(P, run, now, url)
  if type(url) ~= 'string' or url == '' then
    return
  end
  local started, finished = tonumber(run.started_at) or 0, tonumber(run.finished_at) or 0
  local duration = 0
  if started > 0 and finished >= started then
    duration = finished - started
  end
  local token = run.fencing_token
  if type(token) ~= 'string' then
    token = int(tonumber(token) or 0)
  end
  local body = cjson.encode({
    schedule_id = run.schedule_id,
    job_id = run.job_id,
    attempt = tonumber(run.attempt) or 0,
    fencing_token = token,
    status = run.state,
    scheduled_at_ms = tonumber(run.scheduled_at) or 0,
    started_at_ms = started,
    finished_at_ms = finished,
    duration_ms = duration,
    error_code = text(run.error_code),
    error_message = text(run.error_message),
    output = text(run.output),
    node_id = text(run.node_id),
  })
  local dtoken, in_flight, due = '0', '0', int(now)
  if claim_ms then
    -- A new entry's last token is 0: max(0 + 1, store time in µs).
    dtoken, in_flight, due = int(store_now_us()), '1', int(now + claim_ms)
    claimed = cmsgpack.pack({ run.schedule_id, run.job_id, url, body, int(now), dtoken })
  end
  -- `ra` and `rn` (the run's attempt and node, which never change once it is final)
  -- for the events its outcomes note (finish_entry).
  redis.call('HSET', P .. 'delivery:' .. run.schedule_id, 'job_id', run.job_id, 'url', url,
    'body', body, 'created_at', int(now), 'attempts', '0', 'token', dtoken, 'in_flight', in_flight,
    'due', due, 'ra', int(tonumber(run.attempt) or 0), 'rn', text(run.node_id))
  redis.call('ZADD', P .. 'outbox_due', due, run.schedule_id)
  run.callback_state = 'PENDING'
end

-- Makes the run final (the caller has already revoked or released its lease).
-- Returns the serial run released by this one, if `pop`.
local function finalize(P, run, state, reason, now, pop)
  clear_deadlines(run)
  run.state = state
  run.reason = reason
  if run.finished_at == nil or run.finished_at == cjson.null or run.finished_at == 0 then
    run.finished_at = now
  end
  if run.parent ~= nil and run.parent ~= '' then
    -- A shard: count it on its parent, which ends with its last shard.
    local parent = load_run(P, run.parent)
    if not parent or FINAL[parent.state] then
      return nil
    end
    parent.shards_done = (tonumber(parent.shards_done) or 0) + 1
    if state == 'SUCCEEDED' then
      parent.shards_succeeded = (tonumber(parent.shards_succeeded) or 0) + 1
    else
      local note = 'shard ' .. run.shard_index .. ' ' .. state
      if run.error_code ~= nil and run.error_code ~= '' then
        note = note .. ' (' .. run.error_code .. ')'
      end
      if parent.error_message == nil or parent.error_message == '' then
        parent.error_message = note
      else
        parent.error_message = parent.error_message .. '; ' .. note
      end
    end
    local nxt = nil
    if parent.shards_done >= tonumber(parent.shard_total) then
      local ok = parent.shards_succeeded >= tonumber(parent.shard_total)
      if not ok then
        parent.error_code = 'shards_failed'
      end
      nxt = finalize(P, parent, ok and 'SUCCEEDED' or 'FAILED', '', now, true)
    end
    save_run(P, parent)
    return nxt
  end
  write_outbox(P, run, now, type(run.plan) == 'table' and run.plan.callback_url or nil)
  redis.call('SREM', P .. 'active:' .. run.job_id, run.schedule_id)
  -- The job's serial queue, when it has one (most jobs never do: one LLEN, none when
  -- `end_needs` found it empty in this call: a queue only grows when a run begins).
  local queue = P .. 'serial:' .. run.job_id
  if (empty_queues and empty_queues[run.job_id]) or redis.call('LLEN', queue) == 0 then
    return nil
  end
  redis.call('LREM', queue, 0, run.schedule_id)
  if pop and not has_unqueued_active(P, run.job_id) then
    return pop_serial(P, run.job_id, now)
  end
  return nil
end

-- Cancels a run that is not final and, for a fanned-out broadcast run, each of its
-- shards still going (the parent first, so they do not count on it). Returns the
-- revocations and the serial run released (if `pop`).
local function cancel_tree(P, N, run, reason, now, pop)
  local rvs = {}
  local rv = revoke(P, N, run, reason)
  if rv then
    rvs[#rvs + 1] = rv
  end
  local nxt = finalize(P, run, 'CANCELLED', reason, now, pop)
  if (run.parent == nil or run.parent == '') and (tonumber(run.shard_total) or 0) > 0 then
    save_run(P, run)
    for i = 0, tonumber(run.shard_total) - 1 do
      local s = load_run(P, run.schedule_id .. '#' .. i)
      if s and not FINAL[s.state] then
        local srv = revoke(P, N, s, reason)
        if srv then
          rvs[#rvs + 1] = srv
        end
        finalize(P, s, 'CANCELLED', reason, now, false)
        save_run(P, s)
      end
    end
  end
  return rvs, nxt
end

local function backoff_after(plan, attempt)
  local base = tonumber(plan.backoff_ms) or 0
  local mult = tonumber(plan.backoff_multiplier) or 1
  local delay = base
  if mult > 1 then
    delay = base * mult ^ (attempt - 1)
  end
  local cap = tonumber(plan.max_backoff_ms) or 0
  if cap > 0 and delay > cap then
    delay = cap
  end
  return math.floor(delay)
end

-- An attempt ended badly: retry at attempt + 1 after `delay` while attempts remain
-- (with a new token), else final `final_state`. Returns the released serial run.
local function retry_or_final(P, run, final_state, reason, now, delay)
  local max = tonumber(run.plan.max_attempts) or 1
  if run.attempt < max then
    run.last_node = run.node_id
    run.fencing_token = new_token(P)
    run.attempt = run.attempt + 1
    run.state = 'WAITING'
    run.reason = 'retry: ' .. reason
    run.finished_at = cjson.null
    clear_deadlines(run)
    run.deadlines.wake_at = now + delay
    run.deadlines.wait_until = now + delay + (tonumber(run.plan.dispatch_wait_ms) or 0)
    return nil
  end
  return finalize(P, run, final_state, reason, now, true)
end

-- The reply of every transition: {applied, reason, run record, next_serial, the
-- webhook claimed for the caller, then 5 fields (sid, node, token, reason, attempt) per
-- revoked lease}; '' where absent. `rv` is one revocation, a list of them, or nil. A
-- claimed webhook (`write_outbox`) is the MessagePack array {schedule_id, job_id, url,
-- body, created_at, delivery token}.
local function reply(applied, reason, json, rv, nxt)
  local out = { applied, reason or '', json or '', nxt or '', claimed or '' }
  if rv and type(rv[1]) ~= 'table' then
    rv = { rv }
  end
  for _, r in ipairs(rv or {}) do
    for _, f in ipairs(r) do
      out[#out + 1] = f
    end
  end
  return out
end

-- The webhook entry of a run that falls out of its job's index, once done (it only
-- keeps the outcomes, read over the record: finish_entry) goes with the record; one
-- still to deliver stays, and is delivered as its entry says.
local function drop_done_delivery(P, sid)
  local key = P .. 'delivery:' .. sid
  if redis.call('HEXISTS', key, 'done') == 1 then
    redis.call('DEL', key)
  end
end

-- What indexing a new run of job `job_id` (index_new_run) may touch that its caller
-- cannot name (`want`): the oldest entries' records when the oldest may have expired
-- (looked at), and at the count bound the records, logs and shards of those that fall
-- out (deleted; a record declared is read here for its shards). Returns what it read,
-- for index_new_run: {oldest = score or nil, card = count, loaded = nil or sid ->
-- record or false}. On one Redis, where nothing is asked for, the oldest entry is
-- looked at by one new entry in eight and at the count bound only (oldest nil
-- otherwise): at most 8 expired entries are dropped a time, so a job's index still
-- drops them as fast as its runs are begun, with one command fewer per begin.
local function index_needs(P, job_id, retention_ms, max_runs)
  local index = P .. 'runs:' .. job_id
  local head = { card = redis.call('ZCARD', index) }
  if prefix_only and (head.card + 1) % 8 ~= 0 and head.card + 1 <= tonumber(max_runs) then
    return head
  end
  head.oldest = tonumber(redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')[2])
  local last = -1
  if head.oldest and head.oldest + tonumber(retention_ms) <= store_now_ms() then
    last = 7
  end
  -- The new entry may sort before some: one more than the excess.
  local excess = head.card + 1 - tonumber(max_runs)
  if excess > 0 and excess > last then
    last = excess
  end
  if last < 0 or prefix_only then
    return head
  end
  for _, o in ipairs(redis.call('ZRANGE', index, 0, last)) do
    local key = P .. 'run:' .. o
    want(key)
    want(P .. 'logs:' .. o)
    want(P .. 'logmeta:' .. o)
    want(P .. 'delivery:' .. o)
    if declared(key) then
      local r = load_run(P, o)
      head.loaded = head.loaded or {}
      head.loaded[o] = r or false
      for i = 0, (r and tonumber(r.shard_total) or 0) - 1 do
        want(key .. '#' .. i)
      end
    end
  end
  return head
end

-- After a new entry scored `scheduled_at` went into the job's `index` (`card` entries
-- now; `head` as index_needs read it before): drops the entries at its start whose
-- records expired, the oldest up to the first that still exists (at most 8), once the
-- oldest entry was scheduled longer than the retention ago. Returns the oldest score
-- and the count after.
local function drop_expired(P, index, head, card, scheduled_at, retention_ms)
  local oldest = head.oldest
  if not oldest or tonumber(scheduled_at) < oldest then
    oldest = tonumber(scheduled_at)
  end
  if oldest + tonumber(retention_ms) <= store_now_ms() then
    for _, o in ipairs(redis.call('ZRANGE', index, 0, 7)) do
      if redis.call('EXISTS', P .. 'run:' .. o) == 1 then
        break
      end
      redis.call('ZREM', index, o)
      card = card - 1
    end
  end
  return oldest, card
end

-- The TTL of a job's index and active set is twice the retention, written again
-- only by a begin a quarter of the retention after the last one that did (when, the
-- job hash's `kept`) or that creates the index (`head`, index_needs' reading): a
-- record lives its retention from its begin, so neither key expires before the last
-- record it names, and a begin at a steady rate writes no TTL (two commands fewer).
-- An active set created between two such begins has no TTL until the next one; it
-- needs none to go away (a run leaves it when final, and the empty set is gone): the
-- TTL only bounds what a lost member would keep.
-- Returns whether this begin writes them (noting when, while the job exists).
-- `mark_plain`: the job hash's `plain` is set too (begin_plain), beside `kept` when
-- that is written (one HSET), alone when not.
local function keep_due(P, id, version, kept, head, retention_ms, now, mark_plain)
  if version and head.card > 0 and (tonumber(kept) or 0) + tonumber(retention_ms) / 4 > now then
    if mark_plain then
      redis.call('HSET', P .. 'job:' .. id, 'plain', '1')
    end
    return false
  end
  if version and mark_plain then
    redis.call('HSET', P .. 'job:' .. id, 'kept', int(now), 'plain', '1')
  elseif version then
    redis.call('HSET', P .. 'job:' .. id, 'kept', int(now))
  end
  return true
end

-- Indexes a new run record (written with its retention) under its job, keeping
-- the index bounded (the oldest records fall out first; entries whose record expired
-- are dropped from the oldest up to the first that still exists, at most 8 a call).
-- A record lives its retention from when it was begun, which is not before its run
-- was scheduled (the index's score), so while the oldest entry was scheduled within
-- the retention none can have expired and no entry is looked at (an entry that
-- lingers past its record is skipped by listings and dropped by a later call).
-- `head` is what index_needs read before anything was written. Returns a hint: the
-- schedule_ids (space-separated, '' for none) of the two
-- oldest entries when the index is at its bound or its oldest entry leaves the
-- retention within a minute, the ones the job's next begin is likely to look at or
-- drop (its caller declares their keys and saves the round trip of asking).
local function index_run(P, N, job_id, sid, scheduled_at, retention_ms, max_runs, head, keep)
  local index = P .. 'runs:' .. job_id
  local oldest, card = drop_expired(P, index, head,
    head.card + redis.call('ZADD', index, scheduled_at, sid), scheduled_at, retention_ms)
  local excess = card - tonumber(max_runs)
  if excess > 0 then
    for _, o in ipairs(redis.call('ZRANGE', index, 0, excess - 1)) do
      local gone = head.loaded and head.loaded[o]
      if gone == nil then
        gone = load_run(P, o)
      end
      if gone then
        leave_node(N, gone)
        for i = 0, (tonumber(gone.shard_total) or 0) - 1 do
          local shard = load_run(P, o .. '#' .. i)
          if shard then
            leave_node(N, shard)
            redis.call('DEL', P .. 'run:' .. shard.schedule_id)
            redis.call('ZREM', P .. 'timers', shard.schedule_id)
          end
        end
      end
      redis.call('DEL', P .. 'run:' .. o, P .. 'logs:' .. o, P .. 'logmeta:' .. o)
      drop_done_delivery(P, o)
      redis.call('ZREM', P .. 'timers', o)
      redis.call('SREM', P .. 'active:' .. job_id, o)
    end
    redis.call('ZREMRANGEBYRANK', index, 0, excess - 1)
    card = card - excess
  end
  if keep then
    redis.call('PEXPIRE', index, 2 * retention_ms)
  end
  local hint = ''
  if not prefix_only and (card >= tonumber(max_runs) or oldest + tonumber(retention_ms) <= store_now_ms() + 60000) then
    hint = table.concat(redis.call('ZRANGE', index, 0, 1), ' ')
  end
  return hint
end

-- index_run of the run table `run`, after its record is written (its history noting
-- that it is new).
local function index_new_run(P, N, run, scheduled_at, retention_ms, max_runs, head, keep)
  local sid = run.schedule_id
  note_change(run)
  local json = encode_run(run)
  redis.call('SET', P .. 'run:' .. sid, json, 'PX', retention_ms)
  return json, index_run(P, N, run.job_id, sid, scheduled_at, retention_ms, max_runs, head, keep)
end

-- A result's outcome `o` written into the run's fields (an error code or message that
-- is empty left out, as at its default): output, error, the executor's times.
-- finished_at is set before the run may become final, so the webhook body written then
-- has it (a retry clears it again).
local function take_outcome(run, o)
  if o.output ~= nil and o.output ~= cjson.null then
    run.output = o.output
  end
  local code, msg = text(o.error_code), text(o.error_message)
  run.error_code = code ~= '' and code or nil
  run.error_message = msg ~= '' and msg or nil
  if o.started_at ~= nil and o.started_at ~= cjson.null then
    run.started_at = o.started_at
  end
  if o.finished_at ~= nil and o.finished_at ~= cjson.null then
    run.finished_at = o.finished_at
  end
end

-- finish's step (below), `claim_ms` set for it.
local function finish_step(P, N, sid, by, value, outcome_json, node)
  local run
  if by == 'holder' then
    run = load_held(P, sid)
  else
    run = load_run(P, sid)
  end
  if not run then
    return reply('no', 'unknown run')
  end
  if by == 'holder' then
    local refused = holder_refusal(run, node, value)
    if refused then
      return reply('no', refused, encode_run(run))
    end
    if FINAL[run.state] then
      return reply('already', '', encode_run(run))
    end
    if not HELD[run.state] then
      return reply('no', 'run is ' .. run.state, encode_run(run))
    end
  elseif run.state ~= 'WAITING' or run.attempt ~= tonumber(value) then
    return reply('no', 'run is no longer waiting', encode_run(run))
  elseif run.deadlines.wake_at == 0 then
    return reply('no', 'run is queued', encode_run(run))
  end
  local o = cjson.decode(outcome_json)
  local now = store_now_ms()
  if o.state == 'WAITING' then
    -- The executor rejected the dispatch: route it elsewhere, same attempt.
    if by ~= 'holder' then
      return reply('no', 'only a lease holder can reject', encode_run(run))
    end
    leave_node(N, run)
    run.last_node = run.node_id
    run.fencing_token = new_token(P)
    run.state = 'WAITING'
    run.reason = 'rejected: ' .. (o.error_message or '')
    clear_deadlines(run)
    run.deadlines.wake_at = now
    run.deadlines.wait_until = now + (tonumber(run.plan.dispatch_wait_ms) or 0)
    return reply('yes', '', save_run(P, run))
  end
  leave_node(N, run)
  take_outcome(run, o)
  local nxt
  if o.state == 'FAILED' then
    local reason = run.error_code ~= '' and run.error_code or 'failed'
    nxt = retry_or_final(P, run, 'FAILED', reason, now, backoff_after(run.plan, run.attempt))
    if run.state == 'FAILED' then
      run.reason = ''
    end
  else
    nxt = finalize(P, run, o.state, '', now, true)
  end
  return reply('yes', '', save_run(P, run), nil, nxt)
end

-- finish_step's decision for the common result, made on the record's fields as
-- cmsgpack decodes them (as start_run does a Started): a lease holder's report of a
-- run that succeeded, not a broadcast run or a shard, whose job has no serial queue
-- and whose history is not full. The same transition as finish_step's (the record's
-- plan is decoded only when it names a callback URL). nil, before anything is
-- written, for every other case.
local function finish_succeeded(P, N, sid, token, outcome_json, node)
  local key, bytes, off, f = read_fields(P, sid)
  if not f or (tonumber(f.shard_total) or 0) > 0 or (f.parent or '') ~= '' then
    return nil
  end
  local refused = holder_refusal(f, node, token)
  if refused then
    return reply('no', refused, bytes)
  end
  if FINAL[f.state] then
    return reply('already', '', bytes)
  end
  if not HELD[f.state] then
    return reply('no', 'run is ' .. f.state, bytes)
  end
  local o = cjson.decode(outcome_json)
  if o.state ~= 'SUCCEEDED' then
    return nil
  end
  -- A run begin_plain left out of its job's active set (`np`: a run of an allow plan,
  -- not taken in since) is in no serial queue's way and leaves no set; any other may be.
  local job = f.job_id
  if not f.np and not (empty_queues and empty_queues[job]) and redis.call('LLEN', P .. 'serial:' .. job) > 0 then
    return nil
  end
  local now = store_now_ms()
  if N ~= '' and (f.node_id or '') ~= '' then
    leave_busy(N .. 'busy:' .. f.node_id, sid)
  end
  take_outcome(f, o)
  -- finalize's changes.
  f.deadlines, f.state, f.reason = nil, 'SUCCEEDED', nil
  if f.finished_at == nil or f.finished_at == 0 then
    f.finished_at = now
  end
  local pb = string.sub(bytes, off + 1, off + f.pl)
  if string.find(pb, 'callback_url', 1, true) then
    local plan = cmsgpack.unpack(pb)
    write_outbox(P, f, now, type(plan) == 'table' and plan.callback_url or nil)
  end
  if not f.np then
    redis.call('SREM', P .. 'active:' .. job, sid)
  end
  local record = write_fields(key, f, bytes, off, now)
  redis.call('ZREM', P .. 'timers', sid)
  return reply('yes', '', record)
end

-- finish_run's decision (finish_run.lua) for the result of run `sid`: `by` is 'holder'
-- (`value` the token, `node` the holder's node) or 'waiting' (`value` the attempt);
-- `outcome_json` the outcome; `claim` ('' for none) the lease in ms under which the
-- webhook the result makes due (the run's, or a shard's parent's) is claimed for the
-- caller (`write_outbox`). Returns the transition's reply.
local function finish(P, N, sid, by, value, outcome_json, node, claim)
  claim_ms, claimed = tonumber(claim), nil
  local out = by == 'holder' and finish_succeeded(P, N, sid, value, outcome_json, node)
    or finish_step(P, N, sid, by, value, outcome_json, node)
  claim_ms, claimed = nil, nil
  return out
end

-- append_logs's decision (append_logs.lua) for run `sid` reported by `node` with
-- `token`: `lines` a table of JSON lines ({time_ms, level, message, attempt}), each
-- given its seq here and counted as its message's bytes plus `cost`; the oldest fall
-- out past `max`. Only while the run is DISPATCHED or RUNNING: a final log is never
-- appended to. Returns '' when stored, else the reason.
local function append_lines(P, sid, node, token, max, cost, lines)
  local run, refused = held_run(P, sid, node, token)
  if not run then
    return refused
  end
  sid = run.schedule_id
  local runkey = P .. 'run:' .. sid
  local lkey, mkey = P .. 'logs:' .. sid, P .. 'logmeta:' .. sid
  local bytes = tonumber(redis.call('HGET', mkey, 'bytes') or '0')
  for _, json in ipairs(lines) do
    local line = cjson.decode(json)
    line.seq = redis.call('HINCRBY', mkey, 'seq', 1)
    bytes = bytes + #line.message + cost
    redis.call('RPUSH', lkey, cjson.encode(line))
  end
  while bytes > max do
    local old = redis.call('LPOP', lkey)
    if not old then
      bytes = 0
      break
    end
    bytes = bytes - #cjson.decode(old).message - cost
  end
  redis.call('HSET', mkey, 'bytes', bytes)
  local expires = redis.call('PEXPIRETIME', runkey)
  if expires > 0 then
    redis.call('PEXPIREAT', lkey, expires)
    redis.call('PEXPIREAT', mkey, expires)
  end
  return ''
end
