-- include: keys, values, broadcasts, running
-- Keys: JOB..id, RUNNING, WORKERS, WORKER..id, BROADCAST_SEQ, CURSORS, UNREAD, SENT
-- A worker's heartbeat: record it as alive for the dashboard, and extend the leases of
-- the jobs it still owns.
-- ARGV[1] lease (ms), ARGV[2] worker id,
-- ARGV[3] how long the worker's record lives without a heartbeat (s),
-- ARGV[4] P, the number of worker fields, then P name/value pairs,
-- then pairs of job id and owner token
-- Returns the ids the worker no longer owns (their lease ran out and the job moved on).
local now, worker = clock_ms(), ARGV[2]
local pairs_at = 5 + tonumber(ARGV[4]) * 2

-- A record of another type (written by hand) is replaced.
local record = typed(WORKER .. worker, 'hash')
for i = 5, pairs_at - 1, 2 do
  redis.call('HSET', record, ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', record, ARGV[3])
-- The workers and the cursors of another type (spoilt by hand) are replaced.
redis.call('ZADD', typed(WORKERS, 'zset'), now, worker)
redis.call('ZREMRANGEBYSCORE', WORKERS, '-inf', now - 3600000)
-- A worker reads the broadcast messages sent after it first registered, none before.
local cursors = typed(CURSORS, 'zset')
if not redis.call('ZSCORE', cursors, worker) then
  redis.call('ZADD', cursors, last_broadcast(), worker)
end

local lost = {}
for i = pairs_at, #ARGV, 2 do
  local id, owner = ARGV[i], ARGV[i + 1]
  if is_job(id) and owned_by(redis.call('HMGET', JOB .. id, 'owner', 'status'), owner) then
    -- Its own, so it is RUNNING: a running set replaced (written by hand) learns it back.
    zadd(RUNNING, now + tonumber(ARGV[1]), id)
  else
    table.insert(lost, id)
  end
end
return lost
