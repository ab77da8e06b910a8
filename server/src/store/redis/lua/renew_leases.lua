-- ARGV: P, node_id, ttl_ms, then (schedule_id, token) pairs of this partition.
-- Returns the remaining ms per pair, -1 when the lease is gone.
local P, node, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = store_now_ms()
local out = {}
for i = 4, #ARGV, 2 do
  local run = load_held(P, ARGV[i])
  if run and HELD[run.state] and run.fencing_token == ARGV[i + 1] and run.node_id == node
      and run.deadlines.lease_expires > now then
    run.deadlines.lease_expires = now + ttl
    run.deadlines.confirm_by = 0
    save_run(P, run)
    out[#out + 1] = ttl
  else
    out[#out + 1] = -1
  end
end
return out
