-- include: keys, values, queues, errors, fanout
-- A job's end: its outcome stored with everything it sets off (waiters, stats, the
-- failed index, its unique key, its group, the jobs waiting for it), a cancellation,
-- and a queue member that is no job recorded as a failed one.

-- How long the per-minute finish counts are kept (s): the dashboard shows an hour.
local STATS_TTL = 7200

-- The fields of a job's hash that its end reads (store_outcome), in this order.
local OUTCOME_FIELDS = {'queue', 'cancelled', 'waiters', 'group', 'then', 'waiting', 'unique',
                        'unique_until'}

-- Store a final outcome (SUCCESSFUL or FAILED), start the result TTL, wake waiters,
-- count it in this minute's stats, and index a failure for the dashboard (not a
-- cancellation, nor a job that never ran: "retry failed jobs" must not run them). The failed
-- index expires with the results it lists; the tick trims what is older. Then the
-- fan-out: count the end in the job's group, and let the jobs waiting for it go (or,
-- if it did not succeed, queue them to `pending` to fail, naming `root`: the job whose
-- failure this one's stems from, itself when it ran).
-- `fields`: the job's OUTCOME_FIELDS, when the caller has read them already.
local function store_outcome(id, status, now, result, error, ttl, pending, root, fields)
  local job = JOB .. id
  fields = fields or redis.call('HMGET', job, unpack(OUTCOME_FIELDS))
  local queue = fields[1] or ''
  if result ~= '' then
    redis.call('HSET', job, 'status', status, 'finished_at', whole(now), 'result', result)
  else
    redis.call('HSET', job, 'status', status, 'finished_at', whole(now))
  end
  if fields[6] then
    redis.call('HDEL', job, 'waiting')
  end
  -- The job's unique key is free again, or held for the rest of its window (unless
  -- another job holds it now).
  if fields[7] and redis.pcall('GET', UNIQUE .. fields[7]) == id then
    local window_left = number(fields[8], 0) - now
    if window_left > 0 then
      redis.call('PEXPIRE', UNIQUE .. fields[7], math.floor(window_left))
    else
      redis.call('DEL', UNIQUE .. fields[7])
    end
  end
  -- The minute's counts get their TTL with their first count: one EXPIRE a minute,
  -- not one per job.
  local stats = STATS .. math.floor(now / 60000)
  local count = redis.pcall('HINCRBY', stats,
                            (status == 'FAILED' and 'failed:' or 'ok:') .. queue, '1')
  if count == 1 then
    redis.call('EXPIRE', stats, STATS_TTL)
  end
  -- A job that fails while it waits never ran (its job before failed, or it was
  -- cancelled): kept out of the index, so that "retry failed jobs" cannot run a
  -- chain's step without the step before it.
  if status == 'FAILED' and not fields[2] and not fields[6] then
    local failed = FAILED .. queue
    redis.pcall('ZADD', failed, now, id)
    redis.pcall('ZREMRANGEBYSCORE', failed, '-inf', now - ttl * 1000)
    redis.call('EXPIRE', failed, ttl)
  end
  if error ~= '' then
    append_error(job, error)
  end
  redis.call('EXPIRE', job, whole(ttl))
  if fields[3] then
    local done = job .. ':done'
    redis.pcall('RPUSH', done, status)
    redis.call('EXPIRE', done, 60)
  end
  if fields[4] then
    count_in_group(job, fields[4], status, now, ttl, pending)
  end
  if fields[5] then
    for _, next_id in ipairs(take_dependents(id, fields[5])) do
      if status == 'SUCCESSFUL' then
        release(next_id, now, pending)
      else
        pending[#pending + 1] = {next_id, dependency_error(id, root or id), root or id}
      end
    end
  end
end

-- Fail the waiting jobs queued in `pending` ({id, error, root}), and those that waited
-- for them in turn: a worklist, not recursion, so a chain of any length ends.
local function fail_pending(pending, now, ttl)
  while #pending > 0 do
    local item = table.remove(pending)
    local job = JOB .. item[1]
    local f = redis.pcall('HMGET', job, 'status', 'waiting')
    if not f.err and f[1] == 'READY' and f[2] then
      store_outcome(item[1], 'FAILED', now, '', item[2], ttl, pending, item[3])
    end
  end
end

-- Record a final outcome, with everything it sets off (see store_outcome).
local function record_outcome(id, status, now, result, error, ttl, fields)
  local pending = {}
  store_outcome(id, status, now, result, error, ttl, pending, nil, fields)
  fail_pending(pending, now, ttl)
end

-- Cancel a READY job (waiting, delayed or queued): out of its sets, FAILED with
-- `error`, marked cancelled (kept out of the failed index). Returns 'CANCELLED', or
-- the status that prevents it ('' when there is no such job).
local function cancel_job(id, error, now, ttl)
  if not is_job(id) then
    return ''
  end
  local fields = redis.call('HMGET', JOB .. id, 'status', 'queue', 'parked', 'fair')
  if not fields[1] then
    return ''
  end
  if fields[1] ~= 'READY' then
    return fields[1]
  end
  local queue = fields[2] or ''
  -- pcall: a queue or delayed set of another type (written by hand) holds no job.
  redis.pcall('ZREM', DELAYED .. queue, id)
  if fields[4] then -- a fair job takes its entry in its turn with it
    fair_drop(id, queue, fields[4], redis.pcall('ZSCORE', QUEUE .. queue, id))
  end
  redis.pcall('ZREM', QUEUE .. queue, id)
  if fields[3] then
    redis.pcall('ZREM', LIMIT .. fields[3] .. ':parked', id)
    redis.call('HDEL', JOB .. id, 'parked')
  end
  redis.call('HSET', JOB .. id, 'cancelled', 1)
  record_outcome(id, 'FAILED', now, '', error, ttl)
  return 'CANCELLED'
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
