-- ARGV: P, group, cutoff_ms. Trims by age (MINID), never past an entry that is pending
-- (delivered, unacked) or not yet delivered to the group.
local P = ARGV[1]
local stream = P .. 'triggers'
if redis.call('EXISTS', stream) == 0 then
  return 0
end
local minid = ARGV[3] .. '-0'
local function older(a, b)
  local ams, aseq = string.match(a, '(%d+)-(%d+)')
  local bms, bseq = string.match(b, '(%d+)-(%d+)')
  if tonumber(ams) ~= tonumber(bms) then
    return tonumber(ams) < tonumber(bms)
  end
  return tonumber(aseq) < tonumber(bseq)
end
local summary = redis.call('XPENDING', stream, ARGV[2])
if summary[2] and older(summary[2], minid) then
  minid = summary[2]
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local info = {}
  for k = 1, #g, 2 do
    info[g[k]] = g[k + 1]
  end
  if info['name'] == ARGV[2] then
    local last = info['last-delivered-id']
    local ms, seq = string.match(last, '(%d+)-(%d+)')
    local next_undelivered = ms .. '-' .. int(tonumber(seq) + 1)
    if older(next_undelivered, minid) then
      minid = next_undelivered
    end
  end
end
return redis.call('XTRIM', stream, 'MINID', minid)
