-- include: keys, values, queues
-- Starting a job for a worker (a claim), and the hand-off: a job given to an idle
-- worker with its wake-up, claimed for it by the enqueue, instead of a wake-up token
-- and one more round trip for the worker to claim it.
--
-- A worker whose claim found no job registers as idle (register_idle): its key
-- IDLE_WORKER..worker holds the claim's ms and the order of its queues, and each of its
-- queues' IDLE..queue holds it at that ms. An enqueue that makes a job READY at once,
-- with no limit, in an empty and unpaused queue, looks there for the latest registered
-- worker whose registration stands (its key holds the same ms) and whose queues before
-- this one are empty or paused (its own claim would take this job first). It starts
-- the job for that worker (start_job) and pushes the claim's reply, JSON, on
-- HANDOFF..worker, the first list the worker's wait blocks on. The hand-off ends the
-- registration: at most one job waits in a worker's hand-off list, and the worker's
-- next claim takes it first if its wait has not (take_handed). Its other queues'
-- entries are stale, dropped when met. The job is RUNNING from the hand-off on, but
-- in HANDED, under a short lease of its own, not in RUNNING: the worker starts it only
-- once it has taken it (its heartbeat, or its next claim, moves it to RUNNING under
-- the worker's lease), so a worker that is dead, frozen or whose reply was lost never
-- starts it late, and the tick gives it back uncounted when that short lease runs out
-- (it never ran). A give-back (abandon) or that tick clears the list.

-- The fields a claim reads: the status first (a job that has ended is skipped), then
-- what the worker needs to run the job.
-- ('trace': where the job's last attempt was traced, for the next one to link to.)
local READ = {'status', 'payload', 'attempts', 'workers', 'lost', 'enqueued_at',
              'started_at', 'queue', 'priority', 'after', 'trace', 'limit', 'max_running',
              'rate', 'fair'}
-- The fields past this one are the job's limits and fairness key, which the reply
-- leaves out.
local REPLIED = 11
-- Where READ has the fairness key.
local FAIR_FIELD = 15

-- The READ fields of a waiting job at queue score `score`: read from its entry when
-- the score says it is kept as one (next_score), the entry taken, and its hash's
-- fields then kept in `fields.hash` for start_job to write; else from its hash, or
-- from an entry met there (made its hash). pcall: a key of another type answers an
-- error instead of the fields.
local function read_waiting(id, score)
  if entry_score(score) then
    local at, priority, queue, payload = take_entry(id)
    if at then
      local fields = {'READY', payload}
      fields[6], fields[8] = at, queue
      if tonumber(priority) ~= 0 then
        fields[9] = priority
      end
      fields.hash = entry_hash_fields({}, at, priority, queue, payload)
      return fields
    end
  end
  local fields = redis.pcall('HMGET', JOB .. id, unpack(READ))
  if not failed(fields) and not fields[1] and expand_entry(id) then
    fields = redis.call('HMGET', JOB .. id, unpack(READ))
  end
  return fields
end

-- Take the next job off `queue`, whose first job (`id`, at `score`; its READ fields:
-- `fields`) was just popped: that job itself, unless it has a fairness key and is not
-- the first of the queue's first turn (fair_first); then the first of that turn
-- (fair_pop, `looks` its budget), the popped job back at its place, and in its turn
-- if it had no entry there (put back by a process older than fair queues). Returns
-- the job's id, fields and score (nil when the queue has none).
local function next_of(queue, id, fields, score, looks)
  local key = fields and not fields.err and fields[FAIR_FIELD]
  if not key then
    return id, fields, score
  end
  local first, turn = fair_first(queue, id, key, score)
  if first then
    return id, fields, score
  end
  redis.call('ZADD', QUEUE .. queue, score, id)
  local entries = FAIR .. queue .. ':' .. fair_turn(key, score)
  if not tonumber(redis.pcall('ZSCORE', entries, id)) then
    fair_add(id, queue, key, score, true)
    turn = nil -- its turn may now come first
  end
  id, score = fair_pop(queue, looks, turn)
  if not id then
    return nil
  end
  if valid_id(id) then
    fields = read_waiting(id, score)
  else
    fields = nil
  end
  return id, fields, score
end

-- Start the job `id` (its READ fields as read: `fields`) for `worker`: RUNNING under a
-- lease, its attempt counted, and `score`, its place in its queue, kept in its hash
-- for a give-back or a recovery to put it back there (running.lua's requeue).
-- `leases`: the set that holds its lease (RUNNING, or HANDED for a job handed over).
-- Returns the claim's reply: {id, owner, field, value, ...}, the job's fields as the
-- worker reads them.
local function start_job(id, fields, score, worker, lease, now, leases)
  local job = JOB .. id
  local attempts = math.floor(math.max(number(fields[3], 0), 0)) + 1
  local owner = worker .. '/' .. attempts
  local workers = fields[4] and (fields[4] .. ',' .. worker) or worker
  local stamp = whole(now)
  local started = fields[7] or stamp
  zadd(leases or RUNNING, whole(now + lease), id)
  local written = {'status', 'RUNNING', 'owner', owner, 'attempts', whole(attempts),
                   'workers', workers, 'last_attempted_at', stamp, 'started_at', started,
                   'score', score}
  if fields.hash then -- a job read from its entry: its hash from now on
    for _, value in ipairs(fields.hash) do
      written[#written + 1] = value
    end
    write_job_hash(id, written)
  else
    redis.call('HSET', job, unpack(written))
  end
  local reply = {id, owner, 'status', 'RUNNING', 'attempts', attempts, 'workers', workers,
                 'last_attempted_at', now, 'started_at', started}
  for i, name in ipairs(READ) do -- the rest as read (absent fields left out)
    if fields[i] and i ~= 1 and i ~= 3 and i ~= 4 and i ~= 7 and i <= REPLIED then
      reply[#reply + 1] = name
      reply[#reply + 1] = fields[i]
    end
  end
  return reply
end

-- Most queues a worker registers on, the first of its order: one that serves hundreds
-- would spend two commands on each, and its other queues wake it with a token.
local IDLE_QUEUES = 16

-- A worker whose claim found nothing in `queues` (in the order it tried them) stands
-- idle for `ttl` ms: past it, a worker that died idle is handed nothing more. One of
-- more queues than it registers on sets IDLE_WIDE: while that stands, an enqueue to any
-- queue leaves a wake-up token (hand_queued).
local function register_idle(worker, queues, now, ttl)
  local stamp = whole(now)
  if #queues > IDLE_QUEUES then
    redis.call('SET', IDLE_WIDE, stamp, 'PX', ttl)
  end
  queues = {unpack(queues, 1, math.min(#queues, IDLE_QUEUES))}
  redis.call('SET', IDLE_WORKER .. worker, stamp .. '|' .. table.concat(queues, ','),
             'PX', ttl)
  for _, queue in ipairs(queues) do
    local idle = typed(IDLE .. queue, 'zset')
    -- Entries registered over a ttl ago stand no more (their worker's key is gone):
    -- dropped here, as the enqueue meets the latest entries only.
    redis.call('ZREMRANGEBYSCORE', idle, '-inf', '(' .. whole(now - ttl))
    redis.call('ZADD', idle, stamp, worker)
    redis.call('PEXPIRE', idle, ttl)
  end
end

-- The registration of `worker` ends: nothing more is handed to it.
local function end_registration(worker)
  redis.call('DEL', IDLE_WORKER .. worker)
end

-- The first claim after a registration: the registration ends, and the job handed
-- meanwhile, if any, is the claim's (its reply, JSON, and its id), else nil. An entry
-- that names no job the worker owns (written by hand) is dropped.
local function take_handed(worker)
  end_registration(worker)
  local handed = redis.pcall('LPOP', HANDOFF .. worker) -- another type: none handed
  if type(handed) ~= 'string' then
    return nil
  end
  local ok, reply = pcall(cjson.decode, handed)
  local id = ok and type(reply) == 'table' and reply[1]
  if not valid_id(id) then
    return nil
  end
  local f = redis.pcall('HMGET', JOB .. id, 'owner', 'status')
  if f.err or f[1] ~= reply[2] or f[2] ~= 'RUNNING' then
    return nil
  end
  return handed, id
end

-- Most entries of a queue's idle registry an enqueue looks at.
local IDLE_LOOKS = 8

-- Whether a worker's claim in `order` (its queues, comma-separated) would take a job
-- of `queue` first: every queue before it is empty or paused.
local function first_for(order, queue)
  for name in string.gmatch(order, '[^,]+') do
    if name == queue then
      return true
    end
    local waiting = redis.pcall('ZCARD', QUEUE .. name)
    if not failed(waiting) and waiting > 0 and not is_paused(name) then
      return false
    end
  end
  return false -- its registration no longer names the queue
end

-- The idle worker to hand the first job of `queue` to, or nil: the latest registered
-- whose registration stands and whose claim would take that job first. Stale entries
-- met go. The latest, not the longest idle: a worker killed while idle keeps its
-- registration for its ttl, and live idle workers register again every few seconds,
-- so the dead one is soon the oldest, and is picked only when no live worker stands
-- idle.
local function idle_worker_for(queue)
  local idle = IDLE .. queue
  local entries = redis.pcall('ZREVRANGE', idle, 0, IDLE_LOOKS - 1, 'WITHSCORES')
  if failed(entries) then
    return nil
  end
  for i = 1, #entries, 2 do
    local worker, stamp = entries[i], tonumber(entries[i + 1])
    local standing = redis.pcall('GET', IDLE_WORKER .. worker)
    local at, order
    if type(standing) == 'string' then
      at, order = string.match(standing, '^(%d+)|(.*)$')
    end
    if tonumber(at) ~= stamp then
      redis.call('ZREM', idle, worker) -- handed a job, or registered again, since
    elseif first_for(order, queue) then
      return worker
    end
  end
  return nil
end

-- Hand the job `id` (its hash's READ fields: `fields`; its queue score: `score`) to
-- the idle `worker`: started in HANDED under the hand-off's short `lease`, its claim's
-- reply on the worker's hand-off list. The registration ends. No scheduler is woken:
-- one sleeps at most as long as the hand-off's lease, so it sees the deadline in time
-- (a token here cost a scheduler's step a hand-off, and the idle latency with it).
local function hand_over(id, fields, score, worker, queue, lease, now)
  end_registration(worker)
  redis.call('ZREM', IDLE .. queue, worker)
  local reply = start_job(id, fields, score, worker, lease, now, typed(HANDED, 'zset'))
  for i, value in ipairs(reply) do
    if type(value) == 'number' then
      reply[i] = whole(value) -- cjson would print 14 digits
    end
  end
  local handoff = typed(HANDOFF .. worker, 'list')
  redis.call('RPUSH', handoff, cjson.encode(reply))
  redis.call('PEXPIRE', handoff, lease)
end

-- After an enqueue added `added` jobs to `queue`: if they are all it holds (it was
-- empty) and it is not paused, hand its first jobs, in its order, to the idle workers
-- whose claim would take them, one each, until none is left or the first has a limit
-- (its claim decides whether it may start). Returns how many jobs the queue holds
-- then for a wake-up token to announce: none when no worker stands idle on it, as
-- every worker blocked on its wake-up list registered there (or, serving more queues
-- than that names, set IDLE_WIDE) first; busy workers claim without one. Most
-- enqueues find no worker idle on the queue: one command.
local function hand_queued(queue, added, lease, now)
  local key = QUEUE .. queue
  if redis.call('EXISTS', IDLE .. queue, IDLE_WIDE) == 0 then
    return 0
  end
  local waiting = redis.call('ZCARD', key)
  if waiting ~= added or is_paused(queue) then
    return waiting
  end
  local looks = {left = FAIR_LOOKS}
  while waiting > 0 do
    local worker = idle_worker_for(queue)
    if not worker then
      break
    end
    local popped = redis.call('ZPOPMIN', key)
    local fields = read_waiting(popped[1], popped[2])
    local id, score
    id, fields, score = next_of(queue, popped[1], fields, popped[2], looks)
    if not id then
      break
    end
    if not fields or fields.err then -- no job of ours: left for a claim to discard
      redis.call('ZADD', key, score, id)
      break
    end
    if fields[12] then -- a job with a limit: left for a claim
      put_on_queue(id, queue, score, fields[FAIR_FIELD])
      break
    end
    hand_over(id, fields, score, worker, queue, lease, now)
    waiting = waiting - 1
  end
  return waiting
end

-- A job handed to `worker` and not yet taken, given back (tick, abandon), leaves its
-- hand-off list: the worker must not start it.
local function drop_handed(worker, id)
  local handoff = HANDOFF .. worker
  local entry = redis.pcall('LINDEX', handoff, 0)
  if type(entry) == 'string' and string.sub(entry, 1, #id + 3) == '["' .. id .. '"' then
    redis.call('DEL', handoff)
  end
end
