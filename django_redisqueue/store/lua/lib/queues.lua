-- include: keys, values
-- A READY job's place: its score in its queue (priority, then arrival), on its queue or
-- in its queue's delayed set; and whether a queue is paused.

-- Order within a queue: higher priority first, then arrival order (FIFO). Priority is
-- -100..100 and the arrival counter stays below 2^44, so the score is an exact integer
-- in a double. Formatted by hand because Lua prints large numbers with 14 digits.
local function queue_score(priority, seq)
  local p = math.floor(math.min(math.max(number(priority, 0), -100), 100))
  return whole((100 - p) * 17592186044416 + seq)
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

-- Put a READY job on its queue at `score`, and wake the queue's workers. The score is
-- the queue's to keep; the hash gets it at the job's claim (claim.lua) or parking.
local function put_on_queue(id, queue, score)
  zadd(QUEUE .. queue, score, id)
  redis.call('HSET', JOB .. id, 'status', 'READY')
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
