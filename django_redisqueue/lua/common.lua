-- Shared helpers, prepended to every script when the broker loads it.

-- Order within a queue: higher priority first, then arrival order (FIFO). Priority is
-- -100..100 and the arrival counter stays below 2^44, so the score is an exact integer
-- in a double. Formatted by hand because Lua prints large numbers with 14 digits.
local function queue_score(priority, seq)
  return string.format('%.0f', (100 - priority) * 17592186044416 + seq)
end

-- Leave one wake-up token for the idle workers of a queue. The list never holds more
-- than one: a token is a hint that the queue may have work, not a count.
local function leave_wake_token(wake)
  if redis.call('LLEN', wake) == 0 then
    redis.call('RPUSH', wake, '1')
  end
end

-- Finish a RUNNING job, fenced: only the owner recorded at claim time may finish it.
-- status is SUCCESSFUL or FAILED; result is the JSON return value or ''; error is one
-- JSON error object or '', appended to the job's error history.
-- Returns 1 when stored, 0 when the caller no longer owns the job.
local function finish_job(running, job_prefix, id, owner, status, now, result, error, ttl)
  local job = job_prefix .. id
  if redis.call('HGET', job, 'owner') ~= owner then
    return 0
  end
  redis.call('ZREM', running, id)
  redis.call('HDEL', job, 'owner')
  redis.call('HSET', job, 'status', status, 'finished_at', now)
  if result ~= '' then
    redis.call('HSET', job, 'result', result)
  end
  if error ~= '' then
    local errors = redis.call('HGET', job, 'errors')
    if errors then
      errors = string.sub(errors, 1, -2) .. ',' .. error .. ']'
    else
      errors = '[' .. error .. ']'
    end
    redis.call('HSET', job, 'errors', errors)
  end
  redis.call('EXPIRE', job, ttl)
  if redis.call('HEXISTS', job, 'waiters') == 1 then
    local done = job .. ':done'
    redis.call('RPUSH', done, status)
    redis.call('EXPIRE', done, 60)
  end
  return 1
end
