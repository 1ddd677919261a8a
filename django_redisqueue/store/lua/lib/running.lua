-- include: keys, values, queues, errors, limits, outcome
-- A job leaving the RUNNING set: finished (fenced: only its owner may), given back or
-- recovered, back to its place in its queue; and the slot it held under its limit
-- freed, which puts back on their queues the parked jobs that now have room.

-- Put a job (a hash: the caller checked) back on its queue at the place it had (FIFO
-- survives a give-back or a recovery). A job whose stored queue is missing or not a
-- valid name is failed instead, as nothing could ever serve it, and so is a job asked
-- to stop (stop.lua), with the stop's error, as it must not run again: returns false
-- then.
local function requeue(id, now, ttl)
  local fields = redis.call('HMGET', JOB .. id, 'queue', 'priority', 'score', 'stop', 'fair')
  if fields[4] then
    record_outcome(id, 'FAILED', now, '', fields[4], ttl)
    return false
  end
  if not valid_queue(fields[1]) then
    record_outcome(id, 'FAILED', now, '', invalid_error('the job names no valid queue'), ttl)
    return false
  end
  local score = number(fields[3], nil)
  if score then
    put_on_queue(id, fields[1], whole(score), fields[5])
  else
    push_ready(id, fields[1], fields[2], fields[5])
  end
  return true
end

-- Forget the latest attempt of a job given back unfinished: it does not count, and
-- the progress it reported goes with it. A job back to no attempt has not started.
local function forget_attempt(job)
  local fields = redis.call('HMGET', job, 'attempts', 'workers', 'progress')
  local attempts = math.max(number(fields[1], 1) - 1, 0)
  redis.call('HSET', job, 'attempts', attempts)
  -- The progress of an attempt before it stays: that attempt is the latest again.
  local ok, record = pcall(cjson.decode, fields[3] or '')
  if fields[3] and not (ok and type(record) == 'table' and type(record.attempt) == 'number'
                        and record.attempt <= attempts) then
    redis.call('HDEL', job, 'progress')
  end
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

-- Put back on their queues, at their places, the first `most` parked jobs of a limit
-- key that have room by their own limits (counting those put back before them, under
-- whatever limits: they will start, and hold a slot and a start of the key). One in a
-- paused queue takes no room: it cannot start. Then, if jobs stay parked, ask for a
-- look when the first of their limits may have room; `rest_at_once`: at once when jobs
-- past the first `most` were not looked at (a freed slot looks at a few, so the tick
-- looks at a batch: one of them may have room). Returns how many went back.
local function unpark(key, most, now, lease, ttl, rest_at_once)
  local parked = typed(LIMIT .. key .. ':parked', 'zset')
  local rooms, wake, back, starting, stayed = {}, nil, 0, 0, 0
  for _, id in ipairs(redis.call('ZRANGE', parked, 0, most - 1)) do
    local f = is_job(id) and redis.call('HMGET', JOB .. id, 'status', 'parked', 'max_running',
                                        'rate', 'queue')
    if not (f and f[1] == 'READY' and f[2]) then
      redis.call('ZREM', parked, id) -- ended, or gone: not parked any more
    else
      -- The room of each kind of limit, as Redis holds it, read once.
      local kind = (f[3] or '') .. '|' .. (f[4] or '')
      local room = rooms[kind]
      if room == nil then
        local limit = limits_of(key, f[3], f[4])
        room = {limit and limit_room(limit, now) or math.huge, limit}
        rooms[kind] = room
      end
      if room[1] - starting > 0 then
        redis.call('ZREM', parked, id)
        redis.call('HDEL', JOB .. id, 'parked')
        requeue(id, now, ttl)
        back = back + 1
        if not is_paused(f[5] or '') then
          starting = starting + 1
        end
      else -- it stays parked: look again when its limit may have room
        stayed = stayed + 1
        if not room[3] then -- (the first of a kind to stay decides: later ones see more
          -- starting)
          room[3] = room[2] and next_look(room[2], now, lease, starting) or now + lease
          wake = wake and math.min(wake, room[3]) or room[3]
        end
      end
    end
  end
  local left = redis.call('ZCARD', parked)
  if left > 0 then
    -- Jobs stay parked: look again when the first of the limits seen may have room or,
    -- when every job looked at had room (or, `rest_at_once`, some were not looked
    -- at), at once at those past the first `most`.
    look_again(key, (rest_at_once and left > stayed) and now or wake or now)
  end
  return back
end

-- Most parked jobs a finish looks through (the tick looks through a batch).
local FREED_LOOKS_AT = 20

-- A job leaves the RUNNING set (finished, given back, recovered): its slot under its
-- limit, if it held one, frees, and the parked jobs of the limit that now have room go
-- back to their queues.
local function free_slot(id, key, now, lease, ttl)
  if type(key) == 'string' and key ~= ''
      and redis.pcall('SREM', LIMIT .. key .. ':running', id) == 1 then
    unpark(key, FREED_LOOKS_AT, now, lease, ttl, true)
  end
end

-- A job given back unfinished, or handed to a worker that never took it: out of
-- RUNNING and HANDED, its slot under its limit (`limit`, its key) freed, its attempt
-- forgotten (it does not count), back to its place in its queue.
local function give_back(id, limit, now, lease, ttl)
  redis.call('ZREM', RUNNING, id)
  redis.pcall('ZREM', HANDED, id) -- of another type (written by hand): the job is in none
  free_slot(id, limit, now, lease, ttl)
  forget_attempt(JOB .. id)
  requeue(id, now, ttl)
end

-- Whether `fields` (a job's HMGET of 'owner', 'status', ...) say `token` owns the job:
-- the token of its latest claim, while it runs. The hash keeps a token once the job
-- stops running (no command spent on dropping it), where it fences nothing.
local function owned_by(fields, token)
  return not fields.err and fields[1] == token and fields[2] == 'RUNNING'
end

-- Finish a RUNNING job, fenced: only the owner recorded at claim time may finish it.
-- status is SUCCESSFUL or FAILED; RETRY (to the delayed set, due `retry_in` ms from
-- now); or RELEASE (unfinished, its attempt forgotten: the worker was stopped in the
-- middle, or does not know the task): back to its queue, or with `retry_in`, to its
-- delayed set, due that many ms from now. Returns 1 when stored, 0 when the caller is not the owner.
-- `lease` (ms) is the workers' lease, which the job's limit uses (free_slot). `trace`:
-- '' or the attempt's trace record, kept in the job's `trace` field for its next
-- attempt (a retry, an operator's retry) or a group's callback to link to.
local function finish_job(id, owner, status, now, result, error, ttl, retry_in, lease, trace)
  local job = JOB .. id
  -- pcall: a key of another type answers an error, which is no owner. The fields the
  -- outcome reads come in the same call (one command less a job).
  local f = redis.pcall('HMGET', job, 'owner', 'status', 'limit', unpack(OUTCOME_FIELDS))
  if not owned_by(f, owner) then
    return 0
  end
  if trace and trace ~= '' then
    redis.call('HSET', job, 'trace', trace)
  end
  redis.pcall('ZREM', RUNNING, id) -- of another type: the job is in none
  free_slot(id, f[3], now, lease, ttl)
  if status == 'RETRY' or status == 'RELEASE' then
    -- A job asked to stop (stop.lua) does not run again: it ends FAILED, with the
    -- error its attempt ended with, or the stop's.
    local stop = redis.call('HGET', job, 'stop')
    if stop then
      status, error = 'FAILED', (error ~= '' and error) or stop
    end
  end
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
    local later = number(retry_in, 0)
    local queue = later > 0 and redis.call('HGET', job, 'queue')
    if queue and valid_queue(queue) then -- given back for later: its delayed set
      push_delayed(id, now + later, queue)
    else
      requeue(id, now, ttl)
    end
  else
    record_outcome(id, status, now, result, error, ttl, {unpack(f, 4, 3 + #OUTCOME_FIELDS)})
  end
  return 1
end
