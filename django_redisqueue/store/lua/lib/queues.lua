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
-- The counter steps by 2, and a job kept as an entry (`entry`) takes the odd place of
-- the pair, any other job the even one: the score a claim pops says which form to
-- read first (lib/handoff.lua's read_waiting), and arrival order holds, as the pair
-- shares its place. A counter holding garbage (written by hand), or past the 2^44 a
-- score leaves it, starts again from Redis's clock in ms, past any count it can have
-- reached, so that arrivals stay in order.
local function next_score(priority, entry)
  local seq = redis.pcall('INCRBY', SEQ, 2)
  if failed(seq) or seq >= PRIORITY_SPAN then
    redis.call('SET', SEQ, clock_ms())
    seq = redis.call('INCRBY', SEQ, 2)
  end
  local odd = seq % 2
  if entry then
    return queue_score(priority, seq - 1 + odd)
  end
  return queue_score(priority, seq - odd)
end

-- Whether a queue score is one a job kept as an entry takes (next_score).
local function entry_score(score)
  return tonumber(score) % 2 == 1
end

-- Fair queues (docs/protocol.md, "Fair queues"). A job with a fairness key (its hash's
-- 'fair' field) has, besides its place on its queue, an entry in its turn: the sorted
-- set FAIR..queue..':'..turn of the turn's jobs at their queue scores, the turn being
-- '<priority>:<key>'. The queue's turns that have entries are FAIR..queue, each scored
-- as a job of its priority arriving when the turn joined or last had its go: a claim
-- that meets a fair job takes the first job of the first turn instead, and that turn
-- goes behind the others of its priority. So each key with jobs waiting has one go per
-- round, whatever its backlog. A job that leaves the queue otherwise (cancelled,
-- emptied by an operator) takes its entry with it; the queue stays the truth all the
-- same, and an entry whose job is no longer there at that score (claimed by a process
-- older than fair queues) is dropped when met.

-- A fair job's turn: its key at the priority its score holds.
local function fair_turn(key, score)
  return whole(100 - math.floor(tonumber(score) / PRIORITY_SPAN)) .. ':' .. key
end

-- Add job `id`, on `queue` at `score`, to its key's turn, at its place there. Its
-- turn joins behind the turns waiting if it had none; `back` (its old place: given
-- back, recovered, unparked), it comes no later than that place, as the job had it.
local function fair_add(id, queue, key, score, back)
  local turn = fair_turn(key, score)
  local turns = typed(FAIR .. queue, 'zset')
  redis.call('ZADD', typed(turns .. ':' .. turn, 'zset'), score, id)
  redis.call('ZADD', turns, back and 'LT' or 'NX', score, turn)
end

-- Job `id` (fairness key `key`, at `score`) leaves `queue` other than by its turn: its
-- entry goes, and its turn with it when that was the last.
local function fair_drop(id, queue, key, score)
  if type(key) ~= 'string' or not tonumber(score) then
    return
  end
  local turn = fair_turn(key, score)
  local entries = FAIR .. queue .. ':' .. turn
  if redis.pcall('ZREM', entries, id) == 1 and redis.call('ZCARD', entries) == 0 then
    redis.pcall('ZREM', FAIR .. queue, turn)
  end
end

-- Most turns and entries one claim (or hand-off) looks through without finding a
-- job, whatever they hold (entries claimed by older processes, keys spoilt by hand),
-- before it takes the queue's first job instead: a claim stays bounded.
local FAIR_LOOKS = 100

-- A turn (of the queue's `turns`) had its go: it goes behind the other turns of its
-- priority while it has entries left (`left`), else it leaves.
local function had_go(turns, turn, left)
  if left then
    redis.call('ZADD', turns, next_score(string.match(turn, '^(-?%d+):')), turn)
  else
    redis.call('ZREM', turns, turn)
  end
end

-- The first turn of a fair queue's `turns`, or nil.
local function first_turn(turns)
  local first = redis.pcall('ZRANGE', turns, 0, 0)
  return not failed(first) and first[1] or nil
end

-- Whether job `id` (fairness key `key`), just popped off `queue` at `score`, is the
-- first of the queue's first turn: then the job is the queue's next, its entry goes
-- and its turn has had its go, with no put-back and pop again. Also returns the first
-- turn (false: none), which a claim that must look further starts from.
local function fair_first(queue, id, key, score)
  local turns = FAIR .. queue
  local turn = first_turn(turns) or false
  if turn ~= fair_turn(key, score) then
    return false, turn
  end
  local entries = turns .. ':' .. turn
  local head = redis.pcall('ZRANGE', entries, 0, 1)
  if failed(head) or head[1] ~= id then
    return false, turn
  end
  redis.call('ZREM', entries, id) -- (at whatever score: it is the job's own)
  had_go(turns, turn, head[2] ~= nil)
  return true
end

-- Take the next job of a fair queue off it: the first of the first turn, which goes
-- behind the other turns of its priority while it has entries left. `looks` ({left =
-- n}, one per claim) counts the turns and entries met that held no job; `turn`: the
-- first turn when the caller has just read it (false: none), else nil. Returns its id
-- and score; or, when no turn holds a job or the looks ran out, the queue's first job
-- in its own order, its entry dropped (nil when the queue has none).
local function fair_pop(queue, looks, turn)
  local turns, waiting = FAIR .. queue, QUEUE .. queue
  while looks.left > 0 do
    if turn == nil then
      turn = first_turn(turns)
    end
    if not turn then
      break
    end
    local entries = turns .. ':' .. turn
    local popped = redis.pcall('ZPOPMIN', entries)
    if failed(popped) or not popped[1] then
      redis.call('ZREM', turns, turn)
    else
      local id, score = popped[1], popped[2]
      if tonumber(redis.pcall('ZSCORE', waiting, id)) == tonumber(score) then
        redis.call('ZREM', waiting, id)
        had_go(turns, turn, redis.call('ZCARD', entries) > 0)
        return id, score
      end
    end
    turn = nil
    looks.left = looks.left - 1
  end
  local popped = redis.pcall('ZPOPMIN', waiting)
  if failed(popped) or not popped[1] then
    return nil
  end
  local key = valid_id(popped[1]) and redis.pcall('HGET', JOB .. popped[1], 'fair')
  if type(key) == 'string' then
    fair_drop(popped[1], queue, key, popped[2])
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
