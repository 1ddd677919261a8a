-- Shared by every script: the backend's keys and the steps that move a job.
-- The broker prepends this file to each script.
--
-- Every script gets one key, KEYS[1]: the backend's prefix with its hash tag and a
-- colon ('{drq:default}:'). The names below complete it as keys.py spells them
-- (tests/test_broker.py checks that they agree); per-job and per-queue keys are then
-- completed with an id or a queue name, which a claim or a promotion learns only
-- inside the script. Every key carries the one hash tag, so Cluster keeps them on the
-- slot of KEYS[1].
--
-- Two rules keep every move atomic. Time is Redis's (TIME), never a caller's, so
-- clocks of other hosts decide no lease and no due time. And nothing a script reads
-- can make it fail half-way: a job key of another type, or fields holding garbage,
-- are read as absent or as defaults, because Redis does not undo the writes a
-- failing script made before the error.
local P = KEYS[1]
local JOB, QUEUE, WAKE, SEQ = P .. 'job:', P .. 'queue:', P .. 'wake:', P .. 'seq'
local RUNNING, DELAYED, SCHEDULER_WAKE = P .. 'running', P .. 'delayed:', P .. 'scheduler:wake'
local PAUSED, FAILED, STATS = P .. 'paused', P .. 'failed:', P .. 'stats:'
local SCHEDULERS, WORKERS, WORKER = P .. 'schedulers', P .. 'workers', P .. 'worker:'
local KNOWN_QUEUES = P .. 'queues'

-- How long the per-minute finish counts are kept (s): the dashboard shows an hour.
local STATS_TTL = 7200

-- Redis's clock in ms.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A number read from Redis, or the default when it is not a finite number.
local function number(value, default)
  local n = tonumber(value)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then
    return default
  end
  return n
end

-- True when the job's key is a hash. A key of another type (written by hand or by a
-- bug) is not a job: reading it as one would raise WRONGTYPE in the middle of a move.
local function is_job(id)
  return redis.call('TYPE', JOB .. id)['ok'] == 'hash'
end

-- A queue name as workers and keys use it (see jobs.QUEUE_NAME_RE).
local function valid_queue(name)
  return type(name) == 'string' and #name > 0 and #name <= 64
    and string.find(name, '^[%w_%.%-]+$') ~= nil
end

-- Order within a queue: higher priority first, then arrival order (FIFO). Priority is
-- -100..100 and the arrival counter stays below 2^44, so the score is an exact integer
-- in a double. Formatted by hand because Lua prints large numbers with 14 digits.
local function queue_score(priority, seq)
  local p = math.floor(math.min(math.max(number(priority, 0), -100), 100))
  return string.format('%.0f', (100 - p) * 17592186044416 + seq)
end

-- Leave one wake-up token on a list. It never holds more than one: a token is a hint
-- that there may be work, not a count. Hints, counts and indexes are written with
-- pcall: a key of theirs spoilt by hand must not stop a job from moving.
local function leave_wake_token(wake)
  if redis.pcall('LLEN', wake) == 0 then
    redis.pcall('RPUSH', wake, '1')
  end
end

-- True for the statuses of a job that has ended: it never runs again.
local function final(status)
  return status == 'SUCCESSFUL' or status == 'FAILED'
end

-- The place of a new arrival in a queue: behind the jobs of its priority already there.
local function next_score(priority)
  return queue_score(priority, redis.call('INCR', SEQ))
end

-- Put a READY job on its queue at `score`, and wake the queue's workers.
local function put_on_queue(id, queue, score)
  redis.call('HSET', JOB .. id, 'status', 'READY', 'score', score)
  redis.call('ZADD', QUEUE .. queue, score, id)
  leave_wake_token(WAKE .. queue)
end

-- Make a job READY on its queue, behind the jobs of its priority already there.
local function push_ready(id, queue, priority)
  put_on_queue(id, queue, next_score(priority))
end

-- Put a job in its queue's delayed set, due at `due` (ms). Wake the scheduler when
-- the job is now the first due of that queue, so that it does not sleep past it.
local function add_delayed(id, due, queue)
  local delayed = DELAYED .. queue
  redis.call('ZADD', delayed, due, id)
  if redis.call('ZRANGE', delayed, 0, 0)[1] == id then
    leave_wake_token(SCHEDULER_WAKE)
  end
end

-- Make a job READY in its queue's delayed set, due at `due` (ms).
local function push_delayed(id, due, queue)
  redis.call('HSET', JOB .. id, 'status', 'READY')
  add_delayed(id, due, queue)
end

-- Append one JSON error object to the job's JSON list of errors (a list that is not
-- one, written by hand, is replaced).
local function append_error(job, error)
  if error == '' then
    return
  end
  local errors = redis.call('HGET', job, 'errors')
  if errors and string.sub(errors, 1, 1) == '[' and string.sub(errors, -1) == ']'
      and #errors > 2 then
    errors = string.sub(errors, 1, -2) .. ',' .. error .. ']'
  else
    errors = '[' .. error .. ']'
  end
  redis.call('HSET', job, 'errors', errors)
end

-- Record a final outcome (SUCCESSFUL or FAILED), start the result TTL, wake waiters,
-- count it in this minute's stats, and index a failure for the dashboard (not a
-- cancellation: "retry failed jobs" must not run what someone cancelled). The failed
-- index expires with the results it lists; the tick trims what is older.
local function record_outcome(id, status, now, result, error, ttl)
  local job = JOB .. id
  local fields = redis.call('HMGET', job, 'queue', 'cancelled', 'waiters')
  local queue = fields[1] or ''
  if result ~= '' then
    redis.call('HSET', job, 'status', status, 'finished_at', now, 'result', result)
  else
    redis.call('HSET', job, 'status', status, 'finished_at', now)
  end
  -- The minute's counts get their TTL with their first count: one EXPIRE a minute,
  -- not one per job.
  local stats = STATS .. math.floor(now / 60000)
  local count = redis.pcall('HINCRBY', stats,
                            (status == 'FAILED' and 'failed:' or 'ok:') .. queue, 1)
  if count == 1 then
    redis.call('EXPIRE', stats, STATS_TTL)
  end
  if status == 'FAILED' and not fields[2] then
    local failed = FAILED .. queue
    redis.pcall('ZADD', failed, now, id)
    redis.pcall('ZREMRANGEBYSCORE', failed, '-inf', now - ttl * 1000)
    redis.call('EXPIRE', failed, ttl)
  end
  if error ~= '' then
    append_error(job, error)
  end
  redis.call('EXPIRE', job, ttl)
  if fields[3] then
    local done = job .. ':done'
    redis.pcall('RPUSH', done, status)
    redis.call('EXPIRE', done, 60)
  end
end

-- The error of a job that cannot be run for what Redis holds, as worker.py words it.
local function invalid_error(message)
  return cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.InvalidPayload',
    traceback = 'django_redisqueue.exceptions.InvalidPayload: ' .. message .. '\n',
  })
end

-- A queue member that is not a job (an implausible id, or a key of another type) is
-- recorded as a FAILED job of its own, named after its hash, and dropped.
local function discard_malformed(id, queue, why, now, ttl)
  local name = 'malformed-' .. redis.sha1hex(id)
  redis.call('DEL', JOB .. name)
  redis.call('HSET', JOB .. name, 'queue', queue, 'priority', 0)
  record_outcome(name, 'FAILED', now, '',
                 invalid_error('queue ' .. queue .. ' held ' .. why .. ', removed unrun'), ttl)
end

-- Put a job (a hash: the caller checked) back on its queue at the place it had (FIFO
-- survives a give-back or a recovery). A job whose stored queue is missing or not a
-- valid name is failed instead, as nothing could ever serve it: returns false then.
local function requeue(id, now, ttl)
  local fields = redis.call('HMGET', JOB .. id, 'queue', 'priority', 'score')
  if not valid_queue(fields[1]) then
    record_outcome(id, 'FAILED', now, '', invalid_error('the job names no valid queue'), ttl)
    return false
  end
  local score = number(fields[3], nil)
  if score then
    put_on_queue(id, fields[1], string.format('%.0f', score))
  else
    push_ready(id, fields[1], fields[2])
  end
  return true
end

-- Forget the latest attempt of a job given back unfinished: it does not count. A job
-- back to no attempt has not started either.
local function forget_attempt(job)
  local fields = redis.call('HMGET', job, 'attempts', 'workers')
  local attempts = math.max(number(fields[1], 1) - 1, 0)
  redis.call('HSET', job, 'attempts', attempts)
  if attempts == 0 then
    redis.call('HDEL', job, 'started_at', 'last_attempted_at')
  end
  local workers = fields[2] or ''
  local last_comma = string.find(workers, ',[^,]*$')
  if last_comma then
    redis.call('HSET', job, 'workers', string.sub(workers, 1, last_comma - 1))
  else
    redis.call('HDEL', job, 'workers')
  end
end

-- Finish a RUNNING job, fenced: only the owner recorded at claim time may finish it.
-- status is SUCCESSFUL or FAILED; RETRY (to the delayed set, due `retry_in` ms from
-- now); or RELEASE (back to its queue, unfinished, its attempt forgotten: the worker
-- was stopped in the middle). Returns 1 when stored, 0 when the caller is not the owner.
local function finish_job(id, owner, status, now, result, error, ttl, retry_in)
  local job = JOB .. id
  -- pcall: a key of another type answers an error, which is no owner.
  if redis.pcall('HGET', job, 'owner') ~= owner then
    return 0
  end
  redis.call('ZREM', RUNNING, id)
  redis.call('HDEL', job, 'owner')
  if status == 'RETRY' then
    append_error(job, error)
    local queue = redis.call('HGET', job, 'queue')
    if valid_queue(queue) then
      push_delayed(id, now + number(retry_in, 0), queue)
    else
      record_outcome(id, 'FAILED', now, '', invalid_error('the job names no valid queue'), ttl)
    end
  elseif status == 'RELEASE' then
    forget_attempt(job)
    requeue(id, now, ttl)
  else
    record_outcome(id, status, now, result, error, ttl)
  end
  return 1
end
