-- include: keys, values, queues, unique, outcome
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue,
--       SCHEDULER_WAKE, PAUSED, FAILED..queue, STATS..minute, GROUP..gid, UNIQUE..key,
--       FAIR..queue
-- What an operator does from the dashboard, on up to ARGV[3] jobs of one queue.
-- ARGV[1] action: 'retry_failed' (back to the queue, errors kept), 'delete_failed',
--   'run_now' (a delayed job, queued at once), 'empty' (delete READY jobs), 'pause',
--   'resume'
-- ARGV[2] queue name, ARGV[3] most jobs to handle, ARGV[4] result TTL (s), ARGV[5..] the
--   job ids, or none to take them from the queue's failed index or waiting list
--   (delayed jobs need ids)
-- Returns how many jobs (or queues) it changed.
local action, queue, limit, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

-- The error of a job deleted unrun from its queue by an operator.
local DELETED = cjson.encode({
  exception_class_path = 'django_redisqueue.exceptions.JobCancelled',
  traceback = 'django_redisqueue.exceptions.JobCancelled: deleted from its queue unrun\n',
})

-- A paused set of another type (written by hand) paused nothing: it is replaced.
if action == 'pause' then
  return redis.call('SADD', typed(PAUSED, 'set'), queue)
elseif action == 'resume' then
  local changed = redis.call('SREM', typed(PAUSED, 'set'), queue)
  local waiting = redis.pcall('ZCARD', QUEUE .. queue)
  if not failed(waiting) and waiting > 0 then
    leave_wake_token(WAKE .. queue)
  end
  return changed
end

local ids = {}
for i = 5, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
  if action == 'empty' then
    ids = redis.call('ZRANGE', QUEUE .. queue, 0, limit - 1)
  elseif action == 'retry_failed' or action == 'delete_failed' then
    ids = redis.call('ZRANGE', FAILED .. queue, 0, limit - 1)
  end
end

local changed = 0
for _, id in ipairs(ids) do
  local job = JOB .. id
  if action == 'retry_failed' then
    if redis.call('ZREM', FAILED .. queue, id) == 1 and is_job(id)
        and redis.call('HGET', job, 'status') == 'FAILED'
        and not redis.call('HGET', job, 'cancelled') then
      redis.call('PERSIST', job)
      -- A job stopped on request runs again when an operator says so.
      redis.call('HDEL', job, 'finished_at', 'result', 'waiters', 'stop')
      -- A waiter's token from the failure would end every later wait() at once.
      redis.call('DEL', job .. ':done')
      -- A unique job takes its key again, unless another job holds it now; held
      -- with no TTL, as for any live job, even when it still held it for its window.
      local unique = redis.call('HGET', job, 'unique')
      local holder = unique and unique_holder(unique)
      if unique and (not holder or holder == id) then
        hold_unique(id, {unique = unique}, clock_ms())
      end
      local f = redis.call('HMGET', job, 'priority', 'fair')
      push_ready(id, queue, f[1], f[2])
      changed = changed + 1
    end
  elseif action == 'delete_failed' then
    if redis.call('ZREM', FAILED .. queue, id) == 1 then
      redis.call('DEL', job, job .. ':done')
      changed = changed + 1
    end
  elseif action == 'run_now' then
    if redis.call('ZREM', DELAYED .. queue, id) == 1 and is_job(id) then
      local f = redis.call('HMGET', job, 'priority', 'fair')
      push_ready(id, queue, f[1], f[2])
      changed = changed + 1
    end
  elseif action == 'empty' then
    local score = redis.pcall('ZSCORE', QUEUE .. queue, id)
    if redis.call('ZREM', QUEUE .. queue, id) == 1 then
      expand_entry(id) -- a job kept as an entry: its hash, deleted below
      fair_drop(id, queue, redis.pcall('HGET', job, 'fair'), score)
      -- A group member, a unique job, or a job others wait for ends first, so that its group still
      -- completes and the jobs waiting for it fail instead of waiting for ever.
      local links = redis.pcall('HMGET', job, 'group', 'then', 'unique')
      if not links.err and (links[1] or links[2] or links[3]) then
        redis.call('HSET', job, 'cancelled', 1)
        record_outcome(id, 'FAILED', clock_ms(), '', DELETED, ttl)
      end
      redis.call('DEL', job)
      changed = changed + 1
    end
  end
end
return changed
