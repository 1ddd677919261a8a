-- Extend the leases of the jobs a worker still owns (its heartbeat).
-- KEYS[1] running zset, KEYS[2] job key prefix
-- ARGV[1] new lease deadline (ms), ARGV[2..] pairs of job id and owner token
-- Returns the ids the worker no longer owns (its lease ran out and the job moved on).
local lost = {}
for i = 2, #ARGV, 2 do
  local id, owner = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[2] .. id, 'owner') == owner then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], id)
  else
    table.insert(lost, id)
  end
end
return lost
