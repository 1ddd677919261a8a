-- Finish the caller's previous jobs, then claim up to N more: the first jobs of the
-- first non-empty, unpaused queue in the order given (a batch never mixes queues).
-- One round trip per batch when busy.
-- ARGV[1] now (ms), ARGV[2] lease (ms), ARGV[3] worker id, ARGV[4] result TTL (s),
-- ARGV[5] F, the number of outcomes to store first, ARGV[6] N, most jobs to claim,
-- ARGV[7], ARGV[8]: id and owner token of a job claimed earlier that the worker starts
--   now, or '' (see "started_by" below)
-- then F groups of 6: job id, owner token, status, result JSON or '', error JSON or '',
--   retry due time (ms, for RETRY)
-- then the names of the queues to try, in order
-- Returns {stored, claimed}: stored holds 1 (stored) or 0 (fenced out: no longer the
-- owner) per outcome; claimed holds {id, payload, attempts, owner, workers, lost} per
-- job claimed.
local now, lease, worker, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local outcomes, wanted = tonumber(ARGV[5]), tonumber(ARGV[6])

local stored = {}
for i = 0, outcomes - 1 do
  local at = 9 + i * 6
  stored[#stored + 1] = finish_job(ARGV[at], ARGV[at + 1], ARGV[at + 2], now,
                                   ARGV[at + 3], ARGV[at + 4], ttl, ARGV[at + 5])
end
local first_queue = 9 + outcomes * 6

-- "started_by" tells a job the worker runs from one it only claimed ahead: if the
-- worker dies, only the first counts as lost (see tick.lua).
if ARGV[7] ~= '' and redis.call('HGET', JOB .. ARGV[7], 'owner') == ARGV[8] then
  redis.call('HSET', JOB .. ARGV[7], 'started_by', ARGV[8])
end

-- A queue member that is not a plausible job id (garbage written by hand or by a bug)
-- is recorded as a FAILED job of its own, named after its hash, and skipped.
local function discard_malformed(id, queue_name)
  local name = 'malformed-' .. redis.sha1hex(id)
  redis.call('HSET', JOB .. name, 'queue', queue_name, 'priority', 0)
  local error = cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.InvalidPayload',
    traceback = 'django_redisqueue.exceptions.InvalidPayload: queue ' .. queue_name ..
      ' held a malformed job id (' .. #id .. ' bytes), removed unrun\n',
  })
  record_outcome(name, 'FAILED', now, '', error, ttl)
end

local function claim(id, first)
  local job = JOB .. id
  local attempts = redis.call('HINCRBY', job, 'attempts', 1)
  local owner = worker .. '/' .. attempts
  local fields = redis.call('HMGET', job, 'payload', 'workers', 'lost')
  local workers = fields[2] and (fields[2] .. ',' .. worker) or worker
  redis.call('HSET', job, 'status', 'RUNNING', 'owner', owner, 'workers', workers,
             'last_attempted_at', now)
  if first then
    redis.call('HSET', job, 'started_by', owner) -- the worker starts the first at once
  end
  if attempts == 1 then
    redis.call('HSET', job, 'started_at', now)
  end
  redis.call('ZADD', RUNNING, now + lease, id)
  return {id, fields[1] or '', attempts, owner, workers, tonumber(fields[3] or 0)}
end

local claimed = {}
for i = first_queue, #ARGV do
  if wanted == 0 then
    break
  end
  local queue = QUEUE .. ARGV[i]
  while #claimed < wanted and redis.call('SISMEMBER', PAUSED, ARGV[i]) == 0 do
    local id = redis.call('ZPOPMIN', queue)[1]
    if not id then
      break
    end
    if #id > 128 or not string.find(id, '^[%w_%-%.:]+$') then
      discard_malformed(id, ARGV[i])
    else
      claimed[#claimed + 1] = claim(id, #claimed == 0)
    end
  end
  if #claimed > 0 then
    -- Pass the wake-up on: another idle worker may take what is left.
    for j = first_queue, #ARGV do
      if redis.call('ZCARD', QUEUE .. ARGV[j]) > 0
          and redis.call('SISMEMBER', PAUSED, ARGV[j]) == 0 then
        leave_wake_token(WAKE .. ARGV[j])
      end
    end
    break
  end
end
return {stored, claimed}
