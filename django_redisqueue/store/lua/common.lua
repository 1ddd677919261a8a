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
-- clocks of other hosts decide no lease and no due time. And nothing stored can make
-- a script fail half-way, because Redis does not undo the writes a failing script
-- made before the error: a job key of another type, or fields holding garbage, are
-- read as absent or as defaults, and a set of the protocol's holding another type
-- (written by hand) is read as empty and replaced when written (zadd, typed).
local P = KEYS[1]
local JOB, QUEUE, WAKE, SEQ = P .. 'job:', P .. 'queue:', P .. 'wake:', P .. 'seq'
local RUNNING, DELAYED, SCHEDULER_WAKE = P .. 'running', P .. 'delayed:', P .. 'scheduler:wake'
local PAUSED, FAILED, STATS = P .. 'paused', P .. 'failed:', P .. 'stats:'
local SCHEDULERS, WORKERS, WORKER = P .. 'schedulers', P .. 'workers', P .. 'worker:'
local KNOWN_QUEUES = P .. 'queues'
local GROUP, GROUPS, BROADCAST = P .. 'group:', P .. 'groups', P .. 'broadcast:'
local BROADCAST_SEQ, CURSORS = BROADCAST .. 'seq', BROADCAST .. 'cursors'
local UNREAD, SENT = BROADCAST .. 'unread', BROADCAST .. 'sent'
local UNIQUE, LIMIT, LIMITS = P .. 'unique:', P .. 'limit:', P .. 'limits'

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

-- True when a redis.pcall answered an error.
local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

-- ZADD to a sorted set of the protocol's (a queue, a delayed set, the running set);
-- one of another type, written by hand, holds no job of ours and is replaced. No
-- command on the common path: the type is looked at only when the write fails.
local function zadd(key, score, member)
  if failed(redis.pcall('ZADD', key, score, member)) then
    redis.call('DEL', key)
    redis.call('ZADD', key, score, member)
  end
end

-- SADD to a set of the protocol's (the queues used), replaced when of another type.
local function sadd(key, member)
  if failed(redis.pcall('SADD', key, member)) then
    redis.call('DEL', key)
    redis.call('SADD', key, member)
  end
end

-- True when `queue` is paused (a paused set of another type pauses nothing).
local function is_paused(queue)
  return redis.pcall('SISMEMBER', PAUSED, queue) == 1
end

-- The place of a new arrival in a queue: behind the jobs of its priority already there.
-- A counter holding garbage (written by hand), or past the 2^44 a score leaves it,
-- starts again from Redis's clock in ms, past any count it can have reached, so that
-- arrivals stay in order.
local function next_score(priority)
  local seq = redis.pcall('INCR', SEQ)
  if failed(seq) or seq >= 17592186044416 then
    redis.call('SET', SEQ, clock_ms())
    seq = redis.call('INCR', SEQ)
  end
  return queue_score(priority, seq)
end

-- Put a READY job on its queue at `score`, and wake the queue's workers.
local function put_on_queue(id, queue, score)
  zadd(QUEUE .. queue, score, id)
  redis.call('HSET', JOB .. id, 'status', 'READY', 'score', score)
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
  zadd(delayed, due, id)
  if redis.call('ZRANGE', delayed, 0, 0)[1] == id then
    leave_wake_token(SCHEDULER_WAKE)
  end
end

-- Make a job READY in its queue's delayed set, due at `due` (ms).
local function push_delayed(id, due, queue)
  redis.call('HSET', JOB .. id, 'status', 'READY')
  add_delayed(id, due, queue)
end

-- A job's options, as the enqueue sends them: '' (none, the common case) or a JSON
-- object with ``unique`` (key), ``unique_ms`` (how long the key holds; 0: while the
-- job has not ended), ``limit`` (key), ``max_running`` and ``rate``/``per`` (starts per
-- ms). Returns a table, empty for none.
local function job_options(json)
  if json == nil or json == '' then
    return {}
  end
  local ok, options = pcall(cjson.decode, json)
  if not ok or type(options) ~= 'table' then
    return {}
  end
  for _, name in ipairs({'unique', 'limit'}) do
    if type(options[name]) ~= 'string' or options[name] == '' then
      options[name] = nil
    end
  end
  return options
end

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
    redis.call('HSET', JOB .. id, 'unique_until', string.format('%.0f', now + ms))
  end
end

-- Limits (docs/protocol.md, "Unique jobs and limits"): jobs that share a limit key
-- may have at most ``max_running`` RUNNING at once and start at most ``rate`` times in
-- any ``per`` ms, each by its own fields (jobs of one key may differ: two tasks, or a
-- deploy that changed a limit), and every job of the key counts against every job's
-- limits: each RUNNING job of the key holds a slot, and each start is a start, whatever
-- limits the job itself carries. The claim checks them; a job over its limit is parked
-- (in no queue, READY, its ``parked`` field naming the key) and comes back to its place
-- in its queue when it has room: a finish, a give-back or a recovery of a job of the
-- key looks through the first parked jobs, and the tick looks at all of them at the
-- time the key's entry in LIMITS gives (when a rate window frees a start, or a lease
-- later as a safety net).

-- A job's limits from its hash fields (key, max_running, rate), or nil for none. What
-- garbage a field holds reads as no limit of that kind, never as a stricter one.
local function limits_of(key, max_running, rate)
  if type(key) ~= 'string' or key == '' then
    return nil
  end
  local starts, per = string.match(type(rate) == 'string' and rate or '', '^(%d+)/(%d+)$')
  local limit = {key = key, running = number(max_running, nil),
                 rate = tonumber(starts), per = tonumber(per)}
  if limit.running then
    limit.running = math.max(math.floor(limit.running), 1)
  end
  if not limit.per or limit.per < 1 or not limit.rate or limit.rate < 1 then
    limit.rate = nil
  end
  return limit
end

-- A key of a limit (or LIMITS itself) as the type it must be: one that holds another
-- type (spoilt by hand) is deleted, as it holds nothing a limit can read.
local function typed(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= kind and found ~= 'none' then
    redis.call('DEL', key)
  end
  return key
end

local function limit_key(suffix, kind, limit)
  return typed(LIMIT .. limit.key .. suffix, kind)
end

-- How long (ms) a key remembers the rates of its jobs past the longest period, after
-- the last enqueue or start of a job with a rate: starts are kept while a job of the
-- key may still be held to them.
local RATE_MEMORY = 86400000

-- The starts a key keeps, as its ``:window`` hash records them from the rates of its
-- jobs: the newest ``starts`` (the largest rate), for ``ms`` (the longest period).
-- That is every start any of its rates can count. A job with a rate (enqueued, or
-- starting) adds its rate to the record. Returns starts, ms (0, 0: no rate, and no
-- start is kept).
local function rate_window(limit)
  local window = limit_key(':window', 'hash', limit)
  local f = redis.call('HMGET', window, 'starts', 'ms')
  local starts, ms = math.floor(number(f[1], 0)), math.floor(number(f[2], 0))
  if limit.rate then
    if limit.rate > starts then
      starts = limit.rate
      redis.call('HSET', window, 'starts', starts)
    end
    if limit.per > ms then
      ms = limit.per
      redis.call('HSET', window, 'ms', ms)
    end
    redis.call('PEXPIRE', window, ms + RATE_MEMORY)
  end
  return starts, ms
end

-- Write a job's limits (job_options) in its hash, where the claim reads them:
-- ``limit`` (the key), ``max_running``, ``rate`` ("<starts>/<ms>"); the key learns the
-- rate (rate_window).
local function store_limits(job, options)
  if options and type(options.limit) == 'string' then
    redis.call('HSET', job, 'limit', options.limit)
    if options.max_running then
      redis.call('HSET', job, 'max_running', options.max_running)
    end
    if options.rate and options.per then
      local rate = string.format('%.0f/%.0f', options.rate, options.per)
      redis.call('HSET', job, 'rate', rate)
      rate_window(limits_of(options.limit, nil, rate))
    end
  end
end

-- Store a new job's hash and make it READY: on its queue (returns the queue, for the
-- caller to wake once per batch), or in its queue's delayed set until `due` (ms).
-- `options` (job_options) adds the job's limits to its hash, where the claim reads them.
local function store_job(id, payload, queue, priority, due, now, options)
  local job = JOB .. id
  store_limits(job, options)
  if due > now then
    redis.call('HSET', job, 'payload', payload, 'queue', queue, 'priority', priority,
               'enqueued_at', now, 'status', 'READY')
    add_delayed(id, due, queue)
    return nil
  end
  local score = next_score(priority)
  zadd(QUEUE .. queue, score, id)
  redis.call('HSET', job, 'payload', payload, 'queue', queue, 'priority', priority,
             'enqueued_at', now, 'status', 'READY', 'score', score)
  return queue
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

-- The error of a job that cannot be run for what Redis holds, as runtime/worker.py words it.
local function invalid_error(message)
  return cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.InvalidPayload',
    traceback = 'django_redisqueue.exceptions.InvalidPayload: ' .. message .. '\n',
  })
end

-- The error of a job that never ran because the job it waited for did not succeed;
-- down a chain, it names the job whose failure started it all (`root`).
local function dependency_error(parent, root)
  local why = 'job ' .. parent .. ', which this job runs after, ended FAILED'
  if root ~= parent then
    why = why .. ' without running: job ' .. root .. ' failed'
  end
  return cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.DependencyFailed',
    traceback = 'django_redisqueue.exceptions.DependencyFailed: ' .. why .. '\n',
  })
end

-- Add job `id` to the jobs waiting for job `parent`: its `:then` list, which its
-- ``then`` field counts (one push, however many wait). A field an older version wrote
-- holds the ids, comma-separated: they move to the list first.
local function add_dependent(parent, id)
  local job = JOB .. parent
  local list = typed(job .. ':then', 'list')
  local count = redis.call('HGET', job, 'then')
  if count and not tonumber(count) then
    for old in string.gmatch(count, '[^,]+') do
      redis.call('RPUSH', list, old)
    end
  end
  redis.call('HSET', job, 'then', redis.call('RPUSH', list, id))
end

-- The ids of the jobs waiting for job `id`, whose ``then`` field is `field`, taken
-- from its `:then` list, or from the field itself as an older version wrote it: the
-- list and the field go, as these jobs are let go or failed now. A list spoilt by hand
-- holds none.
local function take_dependents(id, field)
  local ids = {}
  redis.call('HDEL', JOB .. id, 'then')
  if tonumber(field) then
    local list = JOB .. id .. ':then'
    local listed = redis.pcall('LRANGE', list, 0, -1)
    redis.call('DEL', list)
    return listed.err and ids or listed
  end
  for next_id in string.gmatch(field, '[^,]+') do
    ids[#ids + 1] = next_id
  end
  return ids
end

-- Let a waiting job go (its job before succeeded, or its group ended): into its queue,
-- or its delayed set while its run_after is ahead. Anything else (a job that ended,
-- cancelled meanwhile) is left alone. A job naming no valid queue is queued to
-- `pending` to fail. Returns the queue it went to, if any.
local function release(id, now, pending)
  local job = JOB .. id
  local f = redis.pcall('HMGET', job, 'status', 'waiting', 'queue', 'priority', 'due')
  if f.err or f[1] ~= 'READY' or not f[2] then
    return nil
  end
  if not valid_queue(f[3]) then
    pending[#pending + 1] = {id, invalid_error('the job names no valid queue')}
    return nil
  end
  redis.call('HDEL', job, 'waiting')
  local due = number(f[5], 0)
  if due > now then
    add_delayed(id, due, f[3])
  else
    push_ready(id, f[3], f[4])
  end
  return f[3]
end

local GROUP_CANCELLED = cjson.encode({
  exception_class_path = 'django_redisqueue.exceptions.JobCancelled',
  traceback = 'django_redisqueue.exceptions.JobCancelled: its group was cancelled\n',
})

-- End a sealed group whose members have all ended (once: finished_at marks it): start
-- its TTL, wake its waiters and let its callback go, or, if the group was cancelled
-- (also between two calls of its enqueue, before its callback was stored), fail it.
local function complete_group(gid, now, ttl, pending)
  local group = GROUP .. gid
  local f = redis.call('HMGET', group, 'total', 'ended', 'finished_at', 'callback', 'cancelled')
  local total = number(f[1], nil)
  if not total or number(f[2], 0) < total or f[3] then
    return
  end
  redis.call('HSET', group, 'finished_at', now)
  redis.call('EXPIRE', group, ttl)
  redis.call('EXPIRE', group .. ':members', ttl)
  local done = group .. ':done'
  redis.pcall('RPUSH', done, 'done')
  redis.call('EXPIRE', done, 60)
  if f[4] and f[4] ~= '' then
    if f[5] then
      local callback = JOB .. f[4]
      if redis.pcall('HGET', callback, 'waiting') == '1' then
        redis.call('HSET', callback, 'cancelled', 1)
      end
      pending[#pending + 1] = {f[4], GROUP_CANCELLED}
    else
      release(f[4], now, pending)
    end
  end
end

-- Count a member's end in its group, once per member whatever happens to it later (an
-- operator's retry ends it again), then complete the group if it was the last.
local function count_in_group(job, gid, status, now, ttl, pending)
  if redis.call('HSETNX', job, 'counted', 1) == 0 then
    return
  end
  local group = GROUP .. gid
  -- An unsealed group that expired (its enqueue failed half-way) counts nothing.
  if redis.call('TYPE', group)['ok'] ~= 'hash' then
    return
  end
  -- Read as numbers and written back: a field spoilt by hand must not stop the move.
  local counts = redis.call('HMGET', group, 'ended', 'failed')
  redis.call('HSET', group, 'ended', number(counts[1], 0) + 1)
  if status == 'FAILED' then
    redis.call('HSET', group, 'failed', number(counts[2], 0) + 1)
  end
  complete_group(gid, now, ttl, pending)
end

-- Store a final outcome (SUCCESSFUL or FAILED), start the result TTL, wake waiters,
-- count it in this minute's stats, and index a failure for the dashboard (not a
-- cancellation, nor a job that never ran: "retry failed jobs" must not run them). The failed
-- index expires with the results it lists; the tick trims what is older. Then the
-- fan-out: count the end in the job's group, and let the jobs waiting for it go (or,
-- if it did not succeed, queue them to `pending` to fail, naming `root`: the job whose
-- failure this one's stems from, itself when it ran).
local function store_outcome(id, status, now, result, error, ttl, pending, root)
  local job = JOB .. id
  local fields = redis.call('HMGET', job, 'queue', 'cancelled', 'waiters', 'group', 'then',
                            'waiting', 'unique', 'unique_until')
  local queue = fields[1] or ''
  if result ~= '' then
    redis.call('HSET', job, 'status', status, 'finished_at', now, 'result', result)
  else
    redis.call('HSET', job, 'status', status, 'finished_at', now)
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
                            (status == 'FAILED' and 'failed:' or 'ok:') .. queue, 1)
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
  redis.call('EXPIRE', job, ttl)
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
local function record_outcome(id, status, now, result, error, ttl)
  local pending = {}
  store_outcome(id, status, now, result, error, ttl, pending)
  fail_pending(pending, now, ttl)
end

-- Cancel a READY job (waiting, delayed or queued): out of its sets, FAILED with
-- `error`, marked cancelled (kept out of the failed index). Returns 'CANCELLED', or
-- the status that prevents it ('' when there is no such job).
local function cancel_job(id, error, now, ttl)
  if not is_job(id) then
    return ''
  end
  local fields = redis.call('HMGET', JOB .. id, 'status', 'queue', 'parked')
  if not fields[1] then
    return ''
  end
  if fields[1] ~= 'READY' then
    return fields[1]
  end
  local queue = fields[2] or ''
  -- pcall: a queue or delayed set of another type (written by hand) holds no job.
  redis.pcall('ZREM', DELAYED .. queue, id)
  redis.pcall('ZREM', QUEUE .. queue, id)
  if fields[3] then
    redis.pcall('ZREM', LIMIT .. fields[3] .. ':parked', id)
    redis.call('HDEL', JOB .. id, 'parked')
  end
  redis.call('HSET', JOB .. id, 'cancelled', 1)
  record_outcome(id, 'FAILED', now, '', error, ttl)
  return 'CANCELLED'
end

-- Drop the cursors of workers silent for `window` ms (dead: they must not hold
-- messages for ever), then the broadcast messages every remaining worker has read.
-- With no live worker left, no message will be read: all go.
local function trim_broadcasts(now, window)
  local cursors, unread = CURSORS, UNREAD
  -- Keys of another type (spoilt by hand) are left alone: a hint must not stop a step.
  for _, key in ipairs({cursors, unread, WORKERS}) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'zset' and kind ~= 'none' then
      return
    end
  end
  for _, worker in ipairs(redis.call('ZRANGE', cursors, 0, -1)) do
    local seen = tonumber(redis.call('ZSCORE', WORKERS, worker))
    if not seen or seen < now - window then
      redis.call('ZREM', cursors, worker)
    end
  end
  local lowest = redis.call('ZRANGE', cursors, 0, 0, 'WITHSCORES')[2]
  if lowest then
    redis.call('ZREMRANGEBYSCORE', unread, '-inf', lowest)
  else
    redis.call('DEL', unread)
  end
end

-- Most entries of the groups index older than a result TTL one call looks at.
local GROUPS_TRIMMED = 100

-- Trim the groups index of groups gone: created over a result TTL ago (`ttl`, s) and
-- whose record no longer exists (it expired a result TTL after the group ended). It
-- has no TTL, so that a group lives in it as long as its record, however long that
-- is. A group's enqueue and the tick trim it, a few at a time.
local function trim_groups(now, ttl)
  -- Of another type (written by hand): it lists no group, and is replaced.
  local old = redis.call('ZRANGEBYSCORE', typed(GROUPS, 'zset'), '-inf', now - ttl * 1000,
                         'LIMIT', 0, GROUPS_TRIMMED)
  for _, gid in ipairs(old) do
    if redis.call('EXISTS', GROUP .. gid) == 0 then
      redis.call('ZREM', GROUPS, gid)
    end
  end
end

-- The number of the last broadcast message: the counter's, or past it the highest
-- number a cursor, an unread message or the last message sent holds, so that a
-- counter holding garbage, or deleted, never numbers a message below a cursor (which
-- would pass over it) nor reuses a number. A key of another type counts for none.
local function last_broadcast()
  local highest = number(redis.pcall('GET', BROADCAST_SEQ), 0)
  for _, key in ipairs({CURSORS, UNREAD, SENT}) do
    local top = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    if not top.err then -- SENT is scored by time: its member is the number
      highest = math.max(highest, number(key == SENT and top[1] or top[2], 0))
    end
  end
  return math.floor(highest)
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

-- How many jobs under `limit` may start now: a job's own limits, against every job of
-- its key.
local function limit_room(limit, now)
  local room = math.huge
  if limit.running then
    local slots, held = limit_key(':running', 'set', limit), 0
    -- A slot is held while its job is RUNNING; one whose job is not (a slot left by a
    -- bug or by hand) is dropped here.
    for _, other in ipairs(redis.call('SMEMBERS', slots)) do
      -- pcall: a running set of another type (written by hand) leaves the slot held.
      local lease = redis.pcall('ZSCORE', RUNNING, other)
      if lease then
        held = held + 1
      else
        redis.call('SREM', slots, other)
      end
    end
    room = limit.running - held
  end
  if limit.rate then
    local starts = limit_key(':starts', 'zset', limit)
    local counted = redis.call('ZCOUNT', starts, '(' .. (now - limit.per), '+inf')
    room = math.min(room, limit.rate - counted)
  end
  return math.max(room, 0)
end

-- When a job under `limit` that has no room may have some, with `starting` more jobs
-- of its key about to start (put back by unpark): when enough starts leave its rate
-- window to free one, or, for a running slot (or when its rate has room), a lease from
-- now at the latest (a finish unparks sooner).
local function next_look(limit, now, lease, starting)
  local wake = now + lease
  if limit.rate then
    local starts, since = LIMIT .. limit.key .. ':starts', '(' .. (now - limit.per)
    local counted = redis.call('ZCOUNT', starts, since, '+inf')
    -- The start whose leaving frees one: the rate-th from the newest, counting those
    -- about to start (now) as the newest.
    local leaving = counted + starting - limit.rate
    local frees = nil
    if leaving >= counted then
      frees = now + limit.per
    elseif leaving >= 0 then
      frees = number(redis.call('ZRANGEBYSCORE', starts, since, '+inf', 'WITHSCORES', 'LIMIT',
                                leaving, 1)[2], now) + limit.per
    end
    if frees and (not limit.running or frees < wake) then
      wake = frees
    end
  end
  return wake
end

-- Count a start of job `id` under `limit` (the claim, once it took the job): it holds a
-- slot while RUNNING, and its start is kept while the key's rates can count it.
local function take_limit(id, limit, now)
  redis.call('SADD', limit_key(':running', 'set', limit), id)
  local keep, ms = rate_window(limit)
  if keep > 0 and ms > 0 then
    local starts = limit_key(':starts', 'zset', limit)
    redis.call('ZADD', starts, now, id .. '@' .. now)
    redis.call('ZREMRANGEBYRANK', starts, 0, -keep - 1)
    redis.call('PEXPIRE', starts, ms)
  end
end

-- Ask the tick to look at a limit's parked jobs at `wake` (ms), unless it will sooner;
-- wake the schedulers when that is now the first time they must look.
local function look_again(key, wake)
  local limits = typed(LIMITS, 'zset')
  local current = tonumber(redis.call('ZSCORE', limits, key))
  if current and current <= wake then
    return
  end
  redis.call('ZADD', limits, wake, key)
  if redis.call('ZRANGE', limits, 0, 0)[1] == key then
    leave_wake_token(SCHEDULER_WAKE)
  end
end

-- Park a READY job over its limit, taken off its queue at `score`: it keeps its place
-- (the parked set is ordered by queue score) and waits for room.
local function park(id, limit, score, wake)
  redis.call('ZADD', limit_key(':parked', 'zset', limit), score, id)
  redis.call('HSET', JOB .. id, 'parked', limit.key)
  look_again(limit.key, wake)
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

-- Finish a RUNNING job, fenced: only the owner recorded at claim time may finish it.
-- status is SUCCESSFUL or FAILED; RETRY (to the delayed set, due `retry_in` ms from
-- now); or RELEASE (back to its queue, unfinished, its attempt forgotten: the worker
-- was stopped in the middle). Returns 1 when stored, 0 when the caller is not the owner.
-- `lease` (ms) is the workers' lease, which the job's limit uses (free_slot).
local function finish_job(id, owner, status, now, result, error, ttl, retry_in, lease)
  local job = JOB .. id
  -- pcall: a key of another type answers an error, which is no owner.
  local f = redis.pcall('HMGET', job, 'owner', 'limit')
  if f.err or f[1] ~= owner then
    return 0
  end
  redis.pcall('ZREM', RUNNING, id) -- of another type: the job is in none
  redis.call('HDEL', job, 'owner')
  free_slot(id, f[2], now, lease, ttl)
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
