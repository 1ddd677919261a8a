-- include: keys, values
-- A READY job's place: its score in its queue (priority, then arrival), on its queue or
-- in its queue's delayed set, and its turn in a fair queue; and whether a queue is
-- paused.

-- Order within a queue: higher priority first, then arrival order (FIFO). Priority is
-- -100..100 and the arrival counter stays below 2^44, so the score is an exact integer
-- in a double. Formatted by hand because Lua prints large numbers with 14 digits.
local PRIORITY_SPAN = 17592186044416
local function queue_score(priority, seq)
  local p = math.floor(math.min(math.max(number(priority, 0), -100), 100))
  return whole((100 - p) * PRIORITY_SPAN + seq)
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
  if failed(seq) or seq >= PRIORITY_SPAN then
    redis.call('SET', SEQ, clock_ms())
    seq = redis.call('INCR', SEQ)
  end
  return queue_score(priority, seq)
end

-- Fair queues (docs/protocol.md, "Fair queues"). A job with a fairness key (its hash's
-- 'fair' field) has, besides its place on its queue, an entry '<score> <id>' in the
-- list of its turn, FAIR..queue..':'..turn, the turn being '<priority>:<key>'. The
-- queue's turns that have entries are FAIR..queue, each scored as a job of its
-- priority arriving when the turn joined or last had its go: a claim that meets a
-- fair job takes the first job of the first turn instead, and that turn goes behind
-- the others of its priority. So each key with jobs waiting has one go per round,
-- whatever its backlog. The queue stays the truth: an entry whose job is no longer
-- there at that score (cancelled, moved, claimed by a process older than fairness)
-- is dropped when met.

-- A fair job's turn: its key at the priority its score holds.
local function fair_turn(key, score)
  return whole(100 - math.floor(tonumber(score) / PRIORITY_SPAN)) .. ':' .. key
end

-- Add job `id`, on `queue` at `score`, to its key's turn: last (a new place), or
-- first (`back`: its old place, given back or unparked), its turn then coming no
-- later than that place, as the job had it.
local function fair_add(id, queue, key, score, back)
  local turn = fair_turn(key, score)
  local turns = typed(FAIR .. queue, 'zset')
  local list = typed(turns .. ':' .. turn, 'list')
  if back then
    redis.call('LPUSH', list, score .. ' ' .. id)
    redis.call('ZADD', turns, 'LT', score, turn)
  else
    redis.call('RPUSH', list, score .. ' ' .. id)
    redis.call('ZADD', turns, 'NX', score, turn)
  end
end

-- Most entries of jobs gone from the queue one claim drops before it takes the
-- queue's first job instead: a claim's cost stays bounded after a mass cancel.
local FAIR_LOOKS = 100

-- Take the next job of a fair queue off it: the first of the first turn, which goes
-- behind the other turns of its priority while it has entries left. Returns its id
-- and score; or, when no turn holds a job (the queue's fair entries deleted by hand)
-- or past FAIR_LOOKS dropped entries, the queue's first job in its own order (nil
-- when it has none).
local function fair_pop(queue)
  local turns, waiting = FAIR .. queue, QUEUE .. queue
  for _ = 1, FAIR_LOOKS do
    local first = redis.pcall('ZRANGE', turns, 0, 0)
    local turn = not failed(first) and first[1]
    if not turn then
      break
    end
    local list = turns .. ':' .. turn
    local entry = redis.pcall('LPOP', list)
    if type(entry) ~= 'string' then
      redis.call('ZREM', turns, turn)
    else
      local score, id = string.match(entry, '^(%d+) (.+)$')
      if id and tonumber(redis.pcall('ZSCORE', waiting, id)) == tonumber(score) then
        redis.call('ZREM', waiting, id)
        if redis.call('LLEN', list) > 0 then
          redis.call('ZADD', turns, next_score(string.match(turn, '^(-?%d+):')), turn)
        else
          redis.call('ZREM', turns, turn)
        end
        return id, score
      end
    end
  end
  local popped = redis.pcall('ZPOPMIN', waiting)
  if failed(popped) then
    return nil
  end
  return popped[1], popped[2]
end

-- Put a READY job on its queue at `score`, in its turn too when it has a fairness
-- key (`fair`), and wake the queue's workers. `back`: its old place (else a new one).
-- The score is the queue's to keep; the hash gets it at the job's claim (claim.lua)
-- or parking.
local function place_on_queue(id, queue, score, fair, back)
  zadd(QUEUE .. queue, score, id)
  if fair then
    fair_add(id, queue, fair, score, back)
  end
  redis.call('HSET', JOB .. id, 'status', 'READY')
  leave_wake_token(WAKE .. queue)
end

-- Put a READY job back on its queue at the place it had.
local function put_on_queue(id, queue, score, fair)
  place_on_queue(id, queue, score, fair, true)
end

-- Make a job READY on its queue, behind the jobs of its priority already there.
local function push_ready(id, queue, priority, fair)
  place_on_queue(id, queue, next_score(priority), fair, false)
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
