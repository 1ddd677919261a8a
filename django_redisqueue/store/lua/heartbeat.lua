-- include: keys, values, broadcasts, running
-- Keys: JOB..id, ENTRIES..bucket, RUNNING, HANDED, WORKERS, WORKER..id, BROADCAST_SEQ,
--       CURSORS, UNREAD, SENT
-- A worker's heartbeat: record it as alive for the dashboard, and extend the leases of
-- the jobs it still owns. It is also how a worker takes a job handed to it: the job
-- moves from HANDED to RUNNING under the worker's lease, and the worker starts it
-- only once this call says it still owns it (handoff.lua).
-- ARGV[1] lease (ms), ARGV[2] worker id,
-- ARGV[3] how long the worker's record lives without a heartbeat (s),
-- ARGV[4] P, the number of worker fields, then P name/value pairs,
-- then triples of job id, owner token and the running attempt's trace record or ''
-- (kept in the job's `trace` field: a recovery's attempt links to the lost one)
-- Returns {lost, stopping}: the ids the worker no longer owns (their lease ran out and
-- the job moved on), and those of the jobs it owns that were asked to stop (stop.lua):
-- the worker stops them, should it have missed its stop list's id.
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

local lost, stopping = {}, {}
for i = pairs_at, #ARGV, 3 do
  local id, owner, trace = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local f = is_job(id) and redis.call('HMGET', JOB .. id, 'owner', 'status', 'stop')
  if f and owned_by(f, owner) then
    if f[3] then
      stopping[#stopping + 1] = id
    end
    -- Its own, so it is RUNNING: a running set replaced (written by hand) learns it back.
    zadd(RUNNING, now + tonumber(ARGV[1]), id)
    redis.pcall('ZREM', HANDED, id) -- of another type (written by hand): none handed
    if trace ~= '' then
      redis.call('HSET', JOB .. id, 'trace', trace)
    end
  else
    table.insert(lost, id)
  end
end
return {lost, stopping}
