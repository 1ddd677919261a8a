-- Extend the leases of the jobs a worker still owns (its heartbeat).
-- ARGV[1] new lease deadline (ms), ARGV[2..] pairs of job id and owner token
-- Returns the ids the worker no longer owns (its lease ran out and the job moved on).
local lost = {}
for i = 2, #ARGV, 2 do
  local id, owner = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', JOB .. id, 'owner') == owner then
    redis.call('ZADD', RUNNING, 'XX', ARGV[1], id)
  else
    table.insert(lost, id)
  end
end
return lost
