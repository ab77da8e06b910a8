-- ARGV: P, N (the {nodes} prefix), node_id, within_ms, then schedule_ids of this
-- partition leased to the node (from remove_node).
-- The node's stream ended and it is no longer registered: each of its leases ends at
-- most within_ms from now. Nothing changes if the node registered again meanwhile (its
-- hello renewed what it still holds). Returns how many leases were shortened.
local P, N, node = ARGV[1], ARGV[2], ARGV[3]
-- In a cluster N is '': the caller looked at the node's registration just before.
if N ~= '' and redis.call('EXISTS', N .. 'node:' .. node) == 1 then
  return 0
end
local by = store_now_ms() + tonumber(ARGV[4])
local n = 0
for i = 5, #ARGV do
  local run = load_run(P, ARGV[i])
  if run and HELD[run.state] and run.node_id == node and run.deadlines.lease_expires > by then
    run.deadlines.lease_expires = by
    save_run(P, run)
    n = n + 1
  end
end
return n
