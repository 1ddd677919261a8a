-- include: keys, values
-- Unique jobs (docs/protocol.md, "Unique jobs and limits"): the job that holds a unique
-- key, and a new job taking one. A job's end lets its key go (outcome.lua).

-- The job that holds a unique key, when the key is held: by a job that has not ended
-- (the key has no TTL then), or, after it ended, for the rest of its ``unique_ms``
-- window (a TTL). nil when the key is free: never taken, run out, or its job ended
-- or is gone (a window cannot outlive the job's record).
local function unique_holder(key)
  local unique = UNIQUE .. key
  local holder = redis.pcall('GET', unique)
  if type(holder) ~= 'string' or not is_job(holder) then
    return nil
  end
  if redis.call('PTTL', unique) > 0 or not final(redis.call('HGET', JOB .. holder, 'status')) then
    return holder
  end
  return nil
end

-- Take a unique key for a new job until it ends (store_outcome lets it go, or keeps
-- it for the rest of the ``unique_ms`` window from the enqueue: ``unique_until``).
local function hold_unique(id, options, now)
  local unique = UNIQUE .. options.unique
  -- A key of another type (spoilt by hand) is replaced: it held no job.
  redis.call('DEL', unique)
  redis.call('SET', unique, id)
  redis.call('HSET', JOB .. id, 'unique', options.unique)
  local ms = number(options.unique_ms, 0)
  if ms > 0 then
    redis.call('HSET', JOB .. id, 'unique_until', whole(now + ms))
  end
end
