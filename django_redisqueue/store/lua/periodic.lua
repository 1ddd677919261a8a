-- include: keys, values, new_jobs, unique
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue,
--       SCHEDULER_WAKE, KNOWN_QUEUES, UNIQUE..key, LIMIT..key, PERIODIC, SCHEDULE..name,
--       FAIR..queue
-- Periodic jobs (docs/protocol.md, "Periodic jobs"): each occurrence of a schedule is
-- enqueued once, however many schedulers call. The scheduler computes the occurrences
-- (cron or interval, in Python); this script compare-and-sets the schedule's `last`
-- occurrence and stores their jobs, in one atomic step.
-- PERIODIC is the set of the schedules' names, and SCHEDULE .. name a schedule's
-- hash: `last` (ms of the last occurrence enqueued, or passed while paused),
-- `last_job`, `last_at` (ms, when it was stored), `next` (ms of the next occurrence,
-- for the dashboard), `paused` (1), `spec` (JSON),
-- `timetable` (when it runs, as the scheduler wrote it: the timetable in force),
-- `skipped` (runs not enqueued: missed, catch-up "latest", or while the job holding
-- a unique task's key had not ended).
-- ARGV[1] the mode:
--   'sync' n, then n x (name, spec, timetable, next): register the schedules, store
--     spec, timetable and next, and delete the state of every other schedule. A new
--     schedule, one whose `last` is no number, and one whose `timetable` is another
--     (an edit; or none, written by an older version, beside another spec) start
--     now: the first job is the first occurrence after now of the timetable given.
--     Returns {{last per name, in order}, {names deleted}, {names edited: another
--     timetable was in force}}.
--   'run' name, timetable, expected last ('' if unknown), now (ms, Redis's clock at
--     the caller's step), next, skipped, queue, priority, payload, record queues ('1'
--     or '0'), options ('' or JSON: new_jobs.lua's job_options; the jobs keep their
--     limits), then pairs (occurrence ms, job id), oldest first. Only if the timetable
--     is the one in force and `last` equals the expected one: stores a job for each
--     occurrence after `last` (a job id taken is never overwritten: its occurrence
--     counts as enqueued) and moves `last` to it.
--     Returns {status, last, jobs stored, last job id}; status is 'ok', 'edited' (the
--     timetable in force is another, synced by a scheduler with other settings, or
--     there is none beside a `last`: nothing done), 'stale' (`last` is not the
--     expected one: nothing done; compute again from the `last` returned), 'new' (no
--     state: it starts at the expected last if one was given, else at `now`, with the
--     caller's timetable) or 'paused' (the occurrences up to `now` pass without a job).
--   'pause' name; 'resume' name (of a paused schedule, `last` becomes now: the
--     paused time is not caught up; any other is left alone). Return 1.
--   'run_now' name, job id, payload, queue, priority, record queues, options: a job of the
--     schedule's task at once, recorded as `last_job` (`last` unchanged). Returns the
--     enqueue time (ms), 0 when the id is taken, or {holder id} when the task is unique
--     and the job holding its key has not ended (nothing stored).
-- Any name is refused that is not a valid schedule name: returns {'invalid'} or 0.

-- The schedules' set and a schedule's hash: a key of another type (spoilt by hand)
-- holds no state and is deleted (values.lua's typed); sync rebuilds the set.
local function names_key()
  return typed(PERIODIC, 'set')
end

local function state_key(name)
  return typed(SCHEDULE .. name, 'hash')
end

-- A schedule's `last`: a whole number of ms not after Redis's clock, or nil (none, or
-- spoilt: garbage, or from the future, which would stop the schedule until then).
-- Before the epoch is spoilt too: sync answers -1 for a name it refuses.
local function read_last(key, clock)
  local last = number(redis.call('HGET', key, 'last'), nil)
  if last == nil or last < 0 or last > clock then
    return nil
  end
  return math.floor(last)
end

local mode = ARGV[1]
local clock = clock_ms()

if mode == 'sync' then
  local names = names_key()
  local lasts, given, edited = {}, {}, {}
  local n = tonumber(ARGV[2]) or 0
  for i = 0, n - 1 do
    local name, spec = ARGV[3 + 4 * i], ARGV[4 + 4 * i]
    local timetable, next_at = ARGV[5 + 4 * i], ARGV[6 + 4 * i]
    if valid_queue(name) then
      local key = state_key(name)
      local last = read_last(key, clock)
      local held = redis.call('HGET', key, 'timetable')
      if not held and redis.call('HGET', key, 'spec') == spec then
        held = timetable -- of an older version that kept no timetable: the same spec
      end
      if last ~= nil and held ~= timetable then
        -- Edited: the runs of the timetable given before now were never due (none is
        -- replayed), and those of the one before are no longer.
        last = nil
        if held then
          edited[#edited + 1] = name
        end
      end
      if last == nil then
        last = clock
      end
      redis.call('HSET', key, 'last', whole(last), 'spec', spec, 'timetable', timetable,
                 'next', next_at)
      redis.call('SADD', names, name)
      given[name] = true
      lasts[#lasts + 1] = last
    else
      lasts[#lasts + 1] = -1
    end
  end
  local removed = {}
  for _, name in ipairs(redis.call('SMEMBERS', names)) do
    if not given[name] then
      redis.call('DEL', SCHEDULE .. name)
      redis.call('SREM', names, name)
      removed[#removed + 1] = name
    end
  end
  return {lasts, removed, edited}
end

local name = ARGV[2]
if not valid_queue(name) then
  return mode == 'run' and {'invalid', 0, 0, ''} or 0
end
local key = state_key(name)
redis.call('SADD', names_key(), name)

if mode == 'pause' then
  redis.call('HSET', key, 'paused', 1)
  return 1
elseif mode == 'resume' then
  -- Only a paused schedule: resuming one that runs (a second click, a stale page)
  -- must not move `last` past occurrences due but not yet enqueued.
  if redis.call('HGET', key, 'paused') then
    redis.call('HDEL', key, 'paused')
    redis.call('HSET', key, 'last', whole(clock))
  end
  return 1
elseif mode == 'run_now' then
  local id, payload, queue, priority = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
  local options = job_options(ARGV[8])
  if id_taken(id) then
    return 0
  end
  -- A unique task's job that holds its key has not ended: no second one.
  local holder = options.unique and unique_holder(options.unique)
  if holder then
    return {holder}
  end
  if store_job(id, payload, queue, priority, 0, clock, options) then
    leave_wake_token(WAKE .. queue)
  end
  if options.unique then
    hold_unique(id, options, clock)
  end
  if ARGV[7] == '1' then
    sadd(KNOWN_QUEUES, queue)
  end
  redis.call('HSET', key, 'last_job', id, 'last_at', clock)
  return clock
elseif mode ~= 'run' then
  return redis.error_reply('unknown mode ' .. tostring(mode))
end

local timetable, expected = ARGV[3], number(ARGV[4], nil)
local now, next_at, skipped = number(ARGV[5], clock), ARGV[6], number(ARGV[7], 0)
local queue, priority, payload = ARGV[8], ARGV[9], ARGV[10]
local last = read_last(key, clock)
local in_force = redis.call('HGET', key, 'timetable')
if in_force ~= timetable and (in_force or last) then
  -- The caller's settings are older or newer than the last sync's: it enqueues no run
  -- of its timetable until its own sync makes it the one in force.
  return {'edited', last or 0, 0, ''}
end
if last == nil then
  -- No state (a new schedule, or its state lost: a Redis without persistence, a
  -- scheduler with older settings that deleted it): it goes on from the `last` the
  -- caller knew, if any, so that the run it came for is not dropped; else from now.
  last = math.min(math.floor(now), clock)
  if expected and expected >= 0 and expected <= clock then
    last = math.floor(expected)
  end
  redis.call('HSET', key, 'last', whole(last), 'next', next_at, 'timetable', timetable)
  return {'new', last, 0, ''}
end
if expected == nil or math.floor(expected) ~= last then
  return {'stale', last, 0, ''}
end
if redis.call('HGET', key, 'paused') then
  last = math.max(last, math.min(math.floor(now), clock))
  redis.call('HSET', key, 'last', whole(last), 'next', next_at)
  return {'paused', last, 0, ''}
end
local options = job_options(ARGV[12])
local stored, last_job = 0, ''
for i = 13, #ARGV - 1, 2 do
  local at, id = number(ARGV[i], nil), ARGV[i + 1]
  if at and at > last and at <= clock then
    -- A unique task's run is skipped while the job holding its key has not ended
    -- (or its unique_for window lasts): runs of the schedule never overlap then. A job
    -- with this id exists (another scheduler stored it before `last` was lost or set
    -- back): never overwritten, the occurrence counts as enqueued.
    local holder = options.unique and unique_holder(options.unique)
    if holder then
      skipped = skipped + 1
    elseif not id_taken(id) then
      store_job(id, payload, queue, priority, 0, clock, options)
      if options.unique then
        hold_unique(id, options, clock)
      end
      stored, last_job = stored + 1, id
    end
    last = math.floor(at)
  end
end
redis.call('HSET', key, 'last', whole(last), 'next', next_at)
if stored > 0 then
  leave_wake_token(WAKE .. queue)
  if ARGV[11] == '1' then
    sadd(KNOWN_QUEUES, queue)
  end
  redis.call('HSET', key, 'last_job', last_job, 'last_at', clock)
end
if skipped > 0 then
  -- Read as a number and written back: a field spoilt by hand must not stop the step.
  local total = number(redis.call('HGET', key, 'skipped'), 0) + skipped
  redis.call('HSET', key, 'skipped', whole(total))
end
return {'ok', last, stored, last_job}
