-- include: keys, values, queues, fanout, outcome, running, broadcasts, handoff
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, RUNNING,
--       DELAYED..queue, SCHEDULER_WAKE, PAUSED, FAILED..queue, STATS..minute, SCHEDULERS,
--       WORKERS, GROUP..gid, GROUPS, CURSORS, UNREAD, UNIQUE..key, LIMIT..key, LIMITS,
--       HANDOFF..wid, HANDED, FAIR..queue
-- The scheduler's step: promote due delayed jobs to their queues, recover RUNNING
-- jobs whose lease has passed (their worker died or stalled), unpark jobs held by
-- their limits when their limit's look is due, give back jobs handed to idle workers
-- that did not take them in time, and trim the groups index. Atomic, so any number
-- of schedulers may run: each due job is promoted, and each lost job recovered, once.
-- ARGV[1] scheduler id, ARGV[2] most jobs to move per kind, ARGV[3] how many times a
-- job may be recovered before it fails, ARGV[4] result TTL (s), ARGV[5] error JSON
-- for a job that fails because its workers keep getting lost, ARGV[6] 1 to recover
-- expired leases, 0 to leave them (the scheduler has just seen Redis fail, and gives
-- workers time to renew), ARGV[7] the latest time (ms, Redis's clock) at which
-- this step may recover leases, or 0 for any: a step that runs later was held on its
-- way (CLIENT PAUSE, a busy script, a stalled network), and so were the heartbeats
-- of live workers: it leaves expired leases alone, ARGV[8] the workers' liveness
-- window (ms): when it recovers leases, it also drops the broadcast cursors of workers
-- silent that long (trim_broadcasts); it is also the lease, which limits use,
-- ARGV[9] the time (ms, Redis's clock) of an earlier step, a grace ago: only leases that
-- ran out by then are recovered, or '' for those that ran out by now (see below),
-- ARGV[10] the grace (ms), then the names of the queues whose delayed jobs to promote.
-- Returns {promoted, recovered, failed, next, now, held, overdue, handed}: next is the
-- time (ms) of the next due job or lease deadline (a lease that ran out after ARGV[9]:
-- a grace from now), -1 if there is none, or 0 if a batch was full (call again); now
-- is Redis's time (ms); held is 1 when the step ran past ARGV[7]; overdue is 1 when a
-- lease that ran out is left in the running set (it ran out after ARGV[9], or a batch
-- was full); handed is how many handed jobs went back untaken.
--
-- Why a lease must have run out by an earlier step: Redis may hold every client (a busy
-- script, CLIENT PAUSE) past a lease, and answer the scheduler's step before the
-- heartbeats it refused meanwhile, which land a moment later. No step runs while Redis
-- holds them all, so a lease that ran out by the time of an earlier step ran out while
-- Redis answered; and with a grace since then, its worker, were it alive, has had time
-- to renew it after any hold. A lease that ran out since is left for a later step.
local batch, lost_limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, recover = tonumber(ARGV[4]), ARGV[6] == '1'
local now = clock_ms()
local recover_until = number(ARGV[7], 0)
local held = 0
if recover_until > 0 and now > recover_until then
  recover, held = false, 1
end

-- Who is alive, for the dashboard; entries silent for an hour are dropped. This is
-- the first write, and one Redis refuses when out of memory: then the whole step is
-- refused, as the workers' heartbeats are, so no lease is taken from a live worker.
redis.call('ZADD', typed(SCHEDULERS, 'zset'), now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', SCHEDULERS, '-inf', now - 3600000)

local promoted, full = 0, false
local next = -1
local function consider(score)
  if score and (next == -1 or tonumber(score) < next) then
    next = tonumber(score)
  end
end

for i = 11, #ARGV do
  local queue = ARGV[i]
  local delayed = DELAYED .. queue
  local due = redis.pcall('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, batch)
  if failed(due) then -- of another type (written by hand): no job to promote
    due = {}
  end
  for _, id in ipairs(due) do
    redis.call('ZREM', delayed, id)
    if is_job(id) then
      local fields = redis.call('HMGET', JOB .. id, 'priority', 'status', 'fair')
      if not final(fields[2]) then -- one that has ended (cancelled) does not run again
        push_ready(id, queue, fields[1], fields[3])
        promoted = promoted + 1
      end
    elseif redis.call('EXISTS', JOB .. id) == 1 then
      discard_malformed(id, queue, 'a delayed job whose key is not a hash', now, ttl)
    end
  end
  full = full or #due == batch
  local first = redis.pcall('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  consider(not failed(first) and first[2] or nil)
  redis.pcall('ZREMRANGEBYSCORE', FAILED .. queue, '-inf', now - ttl * 1000)
end

local recovered, failed, overdue = 0, 0, 0
if recover then
  local ran_out_by = math.min(number(ARGV[9], now), now)
  local expired = redis.call('ZRANGEBYSCORE', typed(RUNNING, 'zset'), '-inf', ran_out_by,
                             'LIMIT', 0, batch)
  for _, id in ipairs(expired) do
    redis.call('ZREM', RUNNING, id)
    local job = JOB .. id
    if is_job(id) then
      local f = redis.call('HMGET', job, 'lost', 'owner', 'limit')
      free_slot(id, f[3], now, tonumber(ARGV[8]), ttl)
      local lost = math.floor(math.max(number(f[1], 0), 0)) + 1
      redis.call('HSET', job, 'lost', lost)
      if lost > lost_limit then
        record_outcome(id, 'FAILED', now, '', ARGV[5], ttl)
        failed = failed + 1
      elseif requeue(id, now, ttl) then
        recovered = recovered + 1
      end
    end
  end
  full = full or #expired == batch
  local first = tonumber(redis.call('ZRANGE', RUNNING, 0, 0, 'WITHSCORES')[2])
  if first and first <= now then
    overdue = 1
    first = now + tonumber(ARGV[10]) -- it ran out after ran_out_by: a grace from now
  end
  consider(first)
end

-- Jobs handed to idle workers and not taken by the end of the hand-off's short lease
-- (the worker died, froze, or lost the reply): back to their queue, uncounted, as they
-- never ran. Whatever the recovery's flags, and with no grace: a worker starts a
-- handed job only once its take has moved it to RUNNING, so none of these runs.
local handed_back = 0
local handed = typed(HANDED, 'zset')
local untaken = redis.call('ZRANGEBYSCORE', handed, '-inf', now, 'LIMIT', 0, batch)
for _, id in ipairs(untaken) do
  redis.call('ZREM', handed, id)
  local f = is_job(id) and redis.call('HMGET', JOB .. id, 'owner', 'status', 'limit')
  if f and f[1] and f[2] == 'RUNNING'
      and not redis.call('ZSCORE', typed(RUNNING, 'zset'), id) then
    drop_handed(string.match(f[1], '^(.*)/') or '', id)
    give_back(id, f[3], now, tonumber(ARGV[8]), ttl)
    handed_back = handed_back + 1
  end
end
full = full or #untaken == batch
consider(redis.call('ZRANGE', handed, 0, 0, 'WITHSCORES')[2])

-- Limits whose parked jobs are due a look: those with room go back to their queues
-- (the rest wait for the next look, or for a finish to unpark them).
local window = tonumber(ARGV[8])
local limits = typed(LIMITS, 'zset')
local looks = redis.call('ZRANGEBYSCORE', limits, '-inf', now, 'LIMIT', 0, batch)
for _, key in ipairs(looks) do
  redis.call('ZREM', limits, key)
  unpark(key, batch, now, window, ttl, false)
end
full = full or #looks == batch
consider(redis.call('ZRANGE', limits, 0, 0, 'WITHSCORES')[2])

trim_groups(now, ttl)

-- Dead workers' cursors go, and with them the messages only they had not read; held
-- like the recovery, as the heartbeats that prove a worker alive were held too. Every
-- live worker has a cursor, so more cursors than live workers means a dead one: the
-- full pass over the cursors runs only then.
if recover and redis.call('ZCARD', typed(CURSORS, 'zset'))
    > redis.call('ZCOUNT', typed(WORKERS, 'zset'), now - window, '+inf') then
  trim_broadcasts(now, window)
end

if full then
  next = 0
end
return {promoted, recovered, failed, next, now, held, overdue, handed_back}
