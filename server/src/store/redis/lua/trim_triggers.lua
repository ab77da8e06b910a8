-- KEYS: P..'triggers'. ARGV: group, cutoff_ms. Trims by age (MINID), never past an
-- entry that is pending (delivered, unacked) or not yet delivered to the group. Also
-- forgets consumers (one per instance start) that hold nothing and were last seen
-- before the cutoff; a live one idles for milliseconds between reads, and would be
-- re-created by its next read.
local stream = KEYS[1]
if redis.call('EXISTS', stream) == 0 then
  return 0
end
local minid = ARGV[2] .. '-0'
local function older(a, b)
  local ams, aseq = string.match(a, '(%d+)-(%d+)')
  local bms, bseq = string.match(b, '(%d+)-(%d+)')
  if tonumber(ams) ~= tonumber(bms) then
    return tonumber(ams) < tonumber(bms)
  end
  return tonumber(aseq) < tonumber(bseq)
end
local summary = redis.call('XPENDING', stream, ARGV[1])
if summary[2] and older(summary[2], minid) then
  minid = summary[2]
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local info = {}
  for k = 1, #g, 2 do
    info[g[k]] = g[k + 1]
  end
  if info['name'] == ARGV[1] then
    local last = info['last-delivered-id']
    local ms, seq = string.match(last, '(%d+)-(%d+)')
    local next_undelivered = ms .. '-' .. int(tonumber(seq) + 1)
    if older(next_undelivered, minid) then
      minid = next_undelivered
    end
  end
end
local max_idle = store_now_ms() - tonumber(ARGV[2])
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, ARGV[1])) do
  local info = {}
  for k = 1, #c, 2 do
    info[c[k]] = c[k + 1]
  end
  if tonumber(info['pending']) == 0 and tonumber(info['idle']) > max_idle then
    redis.call('XGROUP', 'DELCONSUMER', stream, ARGV[1], info['name'])
  end
end
return redis.call('XTRIM', stream, 'MINID', minid)
