-- The scheduler's step: promote due delayed jobs to their queues, and recover RUNNING
-- jobs whose lease has passed (their worker died or stalled). Atomic, so any number
-- of schedulers may run: each due job is promoted, and each lost job recovered, once.
-- ARGV[1] now (ms), ARGV[2] most jobs to move per kind, ARGV[3] how many times a job
-- may be recovered before it fails, ARGV[4] result TTL (s), ARGV[5] error JSON for a
-- job that fails because its workers keep getting lost
-- A job counts as lost only if its worker had started it ("started_by" is the owner);
-- one only claimed ahead goes back to its queue uncounted.
-- Returns {promoted, recovered, failed, next}: next is the time (ms) of the next due
-- job or lease deadline, -1 if there is none, or 0 if a batch was full (call again).
local now, batch, lost_limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

-- Who is alive, for the dashboard; entries silent for an hour are dropped.
redis.call('ZADD', SCHEDULERS, now, ARGV[6])
redis.call('ZREMRANGEBYSCORE', SCHEDULERS, '-inf', now - 3600000)

local promoted = 0
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, batch)
for _, id in ipairs(due) do
  local queue = requeue(id)
  redis.call('ZREM', DELAYED, id)
  if queue then
    redis.call('HINCRBY', DELAYED_COUNTS, queue, -1)
    promoted = promoted + 1
  end
end

local recovered, failed = 0, 0
local expired = redis.call('ZRANGEBYSCORE', RUNNING, '-inf', now, 'LIMIT', 0, batch)
for _, id in ipairs(expired) do
  redis.call('ZREM', RUNNING, id)
  local job = JOB .. id
  local fields = redis.call('HMGET', job, 'owner', 'started_by')
  redis.call('HDEL', job, 'owner')
  if redis.call('EXISTS', job) == 0 then
    -- deleted by hand while it ran: nothing left to recover
  elseif fields[2] ~= fields[1] then
    -- claimed ahead by a worker that died before starting it: not the job's fault
    forget_attempt(job)
    requeue(id)
    recovered = recovered + 1
  elseif redis.call('HINCRBY', job, 'lost', 1) > lost_limit then
    record_outcome(id, 'FAILED', now, '', ARGV[5], ARGV[4])
    failed = failed + 1
  elseif requeue(id) then
    recovered = recovered + 1
  end
end

local next = -1
if #due == batch or #expired == batch then
  next = 0
else
  for _, key in ipairs({DELAYED, RUNNING}) do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
    if first and (next == -1 or tonumber(first) < next) then
      next = tonumber(first)
    end
  end
end
return {promoted, recovered, failed, next}
