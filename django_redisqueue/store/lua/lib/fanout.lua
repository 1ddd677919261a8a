-- include: keys, values, queues, errors
-- Fan-out (docs/protocol.md, "Fan-out"): the jobs waiting for another (chains,
-- depends_on) and letting them go, a group's count of its members' ends and its
-- completion, and the trim of the groups index.

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
  local f = redis.pcall('HMGET', job, 'status', 'waiting', 'queue', 'priority', 'due',
                            'fair')
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
    push_ready(id, f[3], f[4], f[6])
  end
  return f[3]
end

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
      pending[#pending + 1] = {f[4], group_cancelled()}
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
