-- Shared by every script: the backend's keys and the steps that move a job.
-- The broker prepends this file to each script.
--
-- Every script gets the same KEYS (KeySchema.script_keys):
--   KEYS[1] job key prefix ({P}:job:)      KEYS[2] queue key prefix ({P}:queue:)
--   KEYS[3] wake-up key prefix ({P}:wake:) KEYS[4] arrival counter ({P}:seq)
--   KEYS[5] running zset                   KEYS[6] delayed zset
--   KEYS[7] the scheduler's wake-up list   KEYS[8] paused queues (set)
--   KEYS[9] failed index prefix ({P}:failed:)
--   KEYS[10] per-minute stats prefix ({P}:stats:)
--   KEYS[11] delayed jobs per queue (hash) KEYS[12] schedulers (zset)
--   KEYS[13] workers (zset)                KEYS[14] worker record prefix ({P}:worker:)
-- Per-job and per-queue keys are built from the prefixes; all share one hash tag.
local JOB, QUEUE, WAKE, SEQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local RUNNING, DELAYED, SCHEDULER_WAKE, PAUSED = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local FAILED, STATS, DELAYED_COUNTS, SCHEDULERS = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local WORKERS, WORKER = KEYS[13], KEYS[14]

-- How long the per-minute finish counts are kept (s): the dashboard shows an hour.
local STATS_TTL = 7200

-- Order within a queue: higher priority first, then arrival order (FIFO). Priority is
-- -100..100 and the arrival counter stays below 2^44, so the score is an exact integer
-- in a double. Formatted by hand because Lua prints large numbers with 14 digits.
local function queue_score(priority, seq)
  return string.format('%.0f', (100 - priority) * 17592186044416 + seq)
end

-- Leave one wake-up token on a list. It never holds more than one: a token is a hint
-- that there may be work, not a count.
local function leave_wake_token(wake)
  if redis.call('LLEN', wake) == 0 then
    redis.call('RPUSH', wake, '1')
  end
end

-- Make a job READY on its queue, behind the jobs of its priority already there.
local function push_ready(id, queue, priority)
  redis.call('HSET', JOB .. id, 'status', 'READY')
  redis.call('ZADD', QUEUE .. queue, queue_score(tonumber(priority), redis.call('INCR', SEQ)), id)
  leave_wake_token(WAKE .. queue)
end

-- Make a job READY in the delayed set, due at `due` (ms). Wake the scheduler when this
-- job is now the first due, so that it does not sleep past it.
local function push_delayed(id, due, queue)
  redis.call('HSET', JOB .. id, 'status', 'READY')
  if redis.call('ZADD', DELAYED, due, id) == 1 then
    redis.call('HINCRBY', DELAYED_COUNTS, queue, 1)
  end
  if redis.call('ZRANGE', DELAYED, 0, 0)[1] == id then
    leave_wake_token(SCHEDULER_WAKE)
  end
end

-- Take a job out of the delayed set; true if it was there.
local function pop_delayed(id, queue)
  if redis.call('ZREM', DELAYED, id) == 1 then
    redis.call('HINCRBY', DELAYED_COUNTS, queue, -1)
    return true
  end
  return false
end

-- Put a job whose queue and priority are stored in its hash back on its queue.
-- Returns the queue's name, or false if the job hash is gone (expired or deleted).
local function requeue(id)
  local fields = redis.call('HMGET', JOB .. id, 'queue', 'priority')
  if not fields[1] then
    return false
  end
  push_ready(id, fields[1], fields[2])
  return fields[1]
end

-- Append one JSON error object to the job's JSON list of errors.
local function append_error(job, error)
  local errors = redis.call('HGET', job, 'errors')
  if errors then
    errors = string.sub(errors, 1, -2) .. ',' .. error .. ']'
  else
    errors = '[' .. error .. ']'
  end
  redis.call('HSET', job, 'errors', errors)
end

-- Record a final outcome (SUCCESSFUL or FAILED), start the result TTL, wake waiters,
-- count it in this minute's stats, and index a failure for the dashboard. The failed
-- index drops entries as old as the TTL, when their job hashes expire.
local function record_outcome(id, status, now, result, error, ttl)
  local job = JOB .. id
  local queue = redis.call('HGET', job, 'queue') or ''
  redis.call('HSET', job, 'status', status, 'finished_at', now)
  local stats = STATS .. math.floor(now / 60000)
  redis.call('HINCRBY', stats, (status == 'FAILED' and 'failed:' or 'ok:') .. queue, 1)
  redis.call('EXPIRE', stats, STATS_TTL)
  if status == 'FAILED' then
    redis.call('ZADD', FAILED .. queue, now, id)
    redis.call('ZREMRANGEBYSCORE', FAILED .. queue, '-inf', now - ttl * 1000)
  end
  if result ~= '' then
    redis.call('HSET', job, 'result', result)
  end
  if error ~= '' then
    append_error(job, error)
  end
  redis.call('EXPIRE', job, ttl)
  if redis.call('HEXISTS', job, 'waiters') == 1 then
    local done = job .. ':done'
    redis.call('RPUSH', done, status)
    redis.call('EXPIRE', done, 60)
  end
end

-- Forget the latest attempt of a job given back unfinished: it does not count.
local function forget_attempt(job)
  redis.call('HINCRBY', job, 'attempts', -1)
  local workers = redis.call('HGET', job, 'workers') or ''
  local last_comma = string.find(workers, ',[^,]*$')
  if last_comma then
    redis.call('HSET', job, 'workers', string.sub(workers, 1, last_comma - 1))
  else
    redis.call('HDEL', job, 'workers')
  end
end

-- Finish a RUNNING job, fenced: only the owner recorded at claim time may finish it.
-- status is SUCCESSFUL or FAILED; RETRY (back to the delayed set, due at retry_at); or
-- RELEASE (back to its queue, unfinished, when the worker was stopped in the middle).
-- Returns 1 when stored, 0 when the caller no longer owns the job.
local function finish_job(id, owner, status, now, result, error, ttl, retry_at)
  local job = JOB .. id
  if redis.call('HGET', job, 'owner') ~= owner then
    return 0
  end
  redis.call('ZREM', RUNNING, id)
  redis.call('HDEL', job, 'owner')
  if status == 'RETRY' then
    append_error(job, error)
    push_delayed(id, retry_at, redis.call('HGET', job, 'queue'))
  elseif status == 'RELEASE' then
    forget_attempt(job)
    requeue(id)
  else
    record_outcome(id, status, now, result, error, ttl)
  end
  return 1
end
