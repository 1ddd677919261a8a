-- A worker's heartbeat: record it as alive for the dashboard, and extend the leases of
-- the jobs it still owns.
-- ARGV[1] now (ms), ARGV[2] new lease deadline (ms), ARGV[3] worker id,
-- ARGV[4] how long the worker's record lives without a heartbeat (s),
-- ARGV[5] P, the number of worker fields, then P name/value pairs,
-- then pairs of job id and owner token
-- Returns the ids the worker no longer owns (their lease ran out and the job moved on).
local now, worker = tonumber(ARGV[1]), ARGV[3]
local pairs_at = 6 + tonumber(ARGV[5]) * 2

local record = WORKER .. worker
for i = 6, pairs_at - 1, 2 do
  redis.call('HSET', record, ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', record, ARGV[4])
redis.call('ZADD', WORKERS, now, worker)
redis.call('ZREMRANGEBYSCORE', WORKERS, '-inf', now - 3600000)

local lost = {}
for i = pairs_at, #ARGV, 2 do
  local id, owner = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', JOB .. id, 'owner') == owner then
    redis.call('ZADD', RUNNING, 'XX', ARGV[2], id)
  else
    table.insert(lost, id)
  end
end
return lost
