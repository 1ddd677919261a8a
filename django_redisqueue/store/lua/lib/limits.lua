-- include: keys, values
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
--
-- Here: a job's limits read from its fields, the room a key has, a start counted, and
-- a job over its limit parked. Putting parked jobs back (unpark, free_slot) is in
-- running.lua: it requeues them, and a requeue may fail a job.

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
      local rate = whole(options.rate) .. '/' .. whole(options.per)
      redis.call('HSET', job, 'rate', rate)
      rate_window(limits_of(options.limit, nil, rate))
    end
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
  redis.call('HSET', JOB .. id, 'parked', limit.key, 'score', score)
  look_again(limit.key, wake)
end
