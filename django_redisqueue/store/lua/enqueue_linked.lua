-- include: keys, values, errors, limits, new_jobs, fanout, outcome, relays
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue,
--       SCHEDULER_WAKE, FAILED..queue, STATS..minute, KNOWN_QUEUES, GROUP..gid, GROUPS,
--       UNIQUE..key, LIMIT..key, RELAYED, FAIR..queue
-- Store jobs that belong to a group or wait for another job: a group's members and its
-- callback, the steps of a chain, a job enqueued with depends_on. One call per batch;
-- a group's batches are sent in one round trip, the last one sealing the group.
-- ARGV[1] 1 to record the queues' names among the queues used (QUEUES is empty),
-- ARGV[2] group id, or '' for none, ARGV[3] 1 when this call holds the group's last
-- batch (its size is then final, and it may complete), ARGV[4] result TTL (s),
-- ARGV[5] 1 when an outbox relay sends the jobs (one relayed before stores nothing,
-- and what it runs after is not looked for: relays.lua), ARGV[6] E, then E ids: the jobs waited for that are not among the jobs of the whole
-- batch (every call of a batch gets them all, so that a missing one refuses every
-- call, not only the one naming it), then 7 values per job: id, payload (JSON envelope), queue name, priority, due time
-- (ms, or 0 for now), options ('' or JSON, new_jobs.lua's job_options: its limits
-- are kept; a unique key is not, the caller refuses one), after: '' (it waits for nothing), the id of a job it runs after
-- (stored earlier in this call or batch, or already in Redis), or '*' (the group's
-- callback: it waits for every member to end). With a group id, every job but the
-- callback is a member.
-- Returns {0, enqueue time per job (0 when its id is taken, or it was relayed before:
-- that job is skipped)},
-- or {1, id} when a job names a job to run after that does not exist: then nothing
-- is stored.
local record_queues, gid, seal = ARGV[1] == '1', ARGV[2], ARGV[3] == '1'
local ttl, relay = tonumber(ARGV[4]), ARGV[5] == '1'
local first_job = 7 + tonumber(ARGV[6])
local now = clock_ms()

-- The jobs of a relay relayed before, skipped; if that is all of them, nothing is
-- looked for (what they run after may be long gone).
local skipped, storing = {}, false
for at = first_job, #ARGV, 7 do
  skipped[ARGV[at]] = relay and relayed_before(ARGV[at])
  storing = storing or not skipped[ARGV[at]]
end
-- Every job waited for must exist before anything is written.
for i = 7, storing and first_job - 1 or 6 do
  if not is_job(ARGV[i]) then
    return {1, ARGV[i]}
  end
end
-- One stored here is there; one skipped here (relayed before) may be long gone.
local here = {}
for at = first_job, #ARGV, 7 do
  local after = ARGV[at + 6]
  if after ~= '' and after ~= '*' and (not here[after] or skipped[after])
      and not skipped[ARGV[at]] and not is_job(after) then
    return {1, after}
  end
  here[ARGV[at]] = true
end

local group = GROUP .. gid
local members = group .. ':members'
if gid ~= '' and redis.call('EXISTS', group) == 0 then
  redis.call('HSET', group, 'created_at', now, 'size', 0, 'ended', 0, 'failed', 0)
  -- Until sealed it expires by itself: a group whose enqueue failed half-way leaves
  -- nothing behind (its members still run; it has no callback yet).
  redis.call('EXPIRE', group, ttl)
  -- The dashboard's index of groups (of another type, spoilt by hand: replaced).
  redis.call('ZADD', typed(GROUPS, 'zset'), now, gid)
  trim_groups(now, ttl)
end

local pending = {}
local enqueued = {}
local woken, to_wake = {}, {}
local function wake_later(queue)
  if queue and not woken[queue] then
    woken[queue] = true
    to_wake[#to_wake + 1] = queue
  end
end

for at = first_job, #ARGV, 7 do
  local id, payload, queue, priority = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local due, options, after = tonumber(ARGV[at + 4]), job_options(ARGV[at + 5]), ARGV[at + 6]
  local job = JOB .. id
  if relay then
    record_relay(id, now)
  end
  if skipped[id] or id_taken(id) then
    enqueued[#enqueued + 1] = 0
  else
    -- The job it waits for: 'waits' (not ended), 'SUCCESSFUL', 'FAILED', or none.
    local before = nil
    if after == '*' and gid ~= '' then
      before = 'waits'
      redis.call('HSET', group, 'callback', id)
    elseif after ~= '' then
      before = redis.call('HGET', JOB .. after, 'status')
      if not final(before) then
        before = 'waits'
        add_dependent(after, id)
      end
    end
    if before == 'waits' or before == 'FAILED' then
      redis.call('HSET', job, 'payload', payload, 'queue', queue, 'priority', priority,
                 'enqueued_at', now, 'status', 'READY', 'waiting', 1, 'due', due,
                 'after', after == '*' and ('group:' .. gid) or after)
      store_limits(job, options)
      if options.fair then
        redis.call('HSET', job, 'fair', options.fair)
      end
      if before == 'FAILED' then
        local root = failure_root(after)
        pending[#pending + 1] = {id, dependency_error(after, root), root}
      end
    else
      wake_later(store_job(id, payload, queue, priority, due, now, options))
      if after ~= '' then
        redis.call('HSET', job, 'after', after)
      end
    end
    if gid ~= '' and after ~= '*' then
      redis.call('HSET', job, 'group', gid)
      redis.call('RPUSH', members, id)
      -- Read as a number and written back: a size spoilt by hand must not stop the call.
      redis.call('HSET', group, 'size', number(redis.call('HGET', group, 'size'), 0) + 1)
    end
    if record_queues then
      sadd(KNOWN_QUEUES, queue)
    end
    enqueued[#enqueued + 1] = now
  end
end
if gid ~= '' then
  if seal then
    -- Sealed: the size is final, and the group lives until its last member ends.
    redis.call('HSET', group, 'total', redis.call('HGET', group, 'size'))
    redis.call('PERSIST', group)
    redis.call('PERSIST', members)
    complete_group(gid, now, ttl, pending)
  elseif redis.call('EXISTS', members) == 1 then
    redis.call('EXPIRE', members, ttl)
  end
end
fail_pending(pending, now, ttl)
for _, queue in ipairs(to_wake) do
  leave_wake_token(WAKE .. queue)
end
return {0, enqueued}
