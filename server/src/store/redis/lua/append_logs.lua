-- ARGV: P, schedule_id, node, token, max_bytes, line_cost, then one JSON line each
-- ({time_ms, level, message, attempt}): append_lines (runlib.lua). Returns '' when
-- stored, else the reason.
return append_lines(ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]),
  { unpack(ARGV, 7) })
