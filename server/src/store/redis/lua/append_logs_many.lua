-- ARGV: P, max_bytes, line_cost, then per run of partition P: schedule_id, node,
-- token, the number of lines n, then its n JSON lines. append_logs of each run, in
-- order, in one step: returns per run '' when stored, else the reason.
local P, max, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i + 3])
  local lines = {}
  for k = 1, n do
    lines[k] = ARGV[i + 3 + k]
  end
  out[#out + 1] = append_lines(P, ARGV[i], ARGV[i + 1], ARGV[i + 2], max, cost, lines)
  i = i + 4 + n
end
return out
