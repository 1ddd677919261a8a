-- include: keys
-- Values read and written whatever Redis holds (keys.lua, the second rule): Redis's
-- clock, numbers read leniently, writes that replace a key of another type, wake-up
-- tokens, and the tests of a job's key, a job id, a queue name and a final status.

-- Redis's clock in ms.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A number as the text a command is given, rounded to a whole one, every digit kept:
-- Lua's own conversion (%.14g) prints 14 digits, through C's slow float printing (a
-- tenth of a claim's cost, when the claim handed its times so). A whole number a
-- double holds exactly, as every time, count and score is, takes the integer path.
local function whole(n)
  if n % 1 == 0 and n >= -9007199254740992 and n <= 9007199254740992 then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end

-- A number read from Redis, or the default when it is not a finite number.
local function number(value, default)
  local n = tonumber(value)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then
    return default
  end
  return n
end

-- A queue name as workers and keys use it (see jobs.QUEUE_NAME_RE).
local function valid_queue(name)
  return type(name) == 'string' and #name > 0 and #name <= 64
    and string.find(name, '^[%w_%.%-]+$') ~= nil
end

-- A job id as enqueues make them (see jobs.JOB_ID_RE): one read from Redis that is not
-- (a queue member, a hand-off entry, an origin in an error, written by hand) names no job.
local function valid_id(id)
  return type(id) == 'string' and #id <= 128 and string.find(id, '^[%w_%-%.:]+$') ~= nil
end

-- True when a redis.pcall answered an error.
local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

-- After a write by pcall that failed (`reply`): its key, if of another type (written
-- by hand), holds nothing of ours and goes, for the caller to write again by call.
-- Any other error (out of memory: Redis 6.2 asks at a script's first write) is left
-- for that call to raise, as it would have.
local function drop_if_spoilt(reply, key)
  if string.find(reply.err, 'WRONGTYPE', 1, true) then
    redis.call('DEL', key)
  end
end

-- A fresh job may be kept as an entry instead of a hash (docs/protocol.md, "A waiting
-- job kept as an entry"): '<enqueued_at>|<priority>|<queue>|<payload>', under its id in
-- the bucket ENTRIES..<its id's first three characters>. Both forms are read for good:
-- only the enqueue of a fresh job writes an entry.
local function entry_bucket(id)
  return ENTRIES .. string.sub(id, 1, 3)
end

local ENTRY = '^(%d+)|(%-?%d+)|([%w_%.%-]+)|(.+)$'

-- Keep a fresh job as an entry. Returns false, writing nothing, when its id holds an
-- entry already; nil when its fields would not read back as one (the caller stores its
-- hash then: a job written by hand, as no enqueue sends such fields).
local function write_entry(id, payload, queue, priority, now)
  if payload == '' or not valid_queue(queue) or not string.find(priority, '^%-?%d+$') then
    return nil
  end
  local entry = whole(now) .. '|' .. priority .. '|' .. queue .. '|' .. payload
  local bucket = entry_bucket(id)
  local written = redis.pcall('HSETNX', bucket, id, entry)
  if failed(written) then
    drop_if_spoilt(written, bucket)
    written = redis.call('HSETNX', bucket, id, entry)
  end
  return written == 1
end

-- Take a job's entry, if it is kept as one: its enqueue time, priority, queue and
-- payload, the entry gone (the caller writes them to the job's hash). An entry that
-- does not parse goes too, and answers nil, as none does.
local function take_entry(id)
  local bucket = entry_bucket(id)
  local entry = redis.pcall('HGET', bucket, id)
  if type(entry) ~= 'string' then
    return nil
  end
  redis.call('HDEL', bucket, id)
  local at, priority, queue, payload = string.match(entry, ENTRY)
  if not payload or not valid_queue(queue) then
    return nil
  end
  return at, priority, queue, payload
end

-- The hash fields of a job kept as an entry, the ones a fresh job's hash holds but
-- its status, appended to `fields`.
local function entry_hash_fields(fields, at, priority, queue, payload)
  fields[#fields + 1] = 'payload'
  fields[#fields + 1] = payload
  fields[#fields + 1] = 'queue'
  fields[#fields + 1] = queue
  fields[#fields + 1] = 'enqueued_at'
  fields[#fields + 1] = at
  if tonumber(priority) ~= 0 then
    fields[#fields + 1] = 'priority'
    fields[#fields + 1] = priority
  end
  return fields
end

-- Write the hash of a job taken from its entry: its key, if of another type (written
-- by hand beside the entry), is no job and gives way.
local function write_job_hash(id, fields)
  local written = redis.pcall('HSET', JOB .. id, unpack(fields))
  if failed(written) then
    drop_if_spoilt(written, JOB .. id)
    redis.call('HSET', JOB .. id, unpack(fields))
  end
end

-- A job kept as an entry gets its hash, with the fields a fresh job's hash holds, and
-- its entry goes: a script reads and changes the one form after that. True when the
-- hash was written (an entry that does not parse goes, and its queue member is then a
-- job without a hash).
local function expand_entry(id)
  local at, priority, queue, payload = take_entry(id)
  if not at then
    return false
  end
  write_job_hash(id, entry_hash_fields({'status', 'READY'}, at, priority, queue, payload))
  return true
end

-- True when a job has id `id`, in either form (a key of any type counts): an id taken
-- stores nothing again.
local function id_taken(id)
  return redis.call('EXISTS', JOB .. id) == 1
    or redis.pcall('HEXISTS', entry_bucket(id), id) == 1
end

-- True when the job's key is a hash, after its entry, if it is kept as one, made into
-- one. A key of another type (written by hand or by a bug) is not a job: reading it as
-- one would raise WRONGTYPE in the middle of a move.
local function is_job(id)
  local kind = redis.call('TYPE', JOB .. id)['ok']
  return kind == 'hash' or (kind == 'none' and expand_entry(id))
end

-- Leave one wake-up token on a list. It never holds more than one: a token is a hint
-- that there may be work, not a count. Hints, counts and indexes are written with
-- pcall: a key of theirs spoilt by hand must not stop a job from moving.
local function leave_wake_token(wake)
  if redis.pcall('LLEN', wake) == 0 then
    redis.pcall('RPUSH', wake, '1')
  end
end

-- True for the statuses of a job that has ended: it never runs again.
local function final(status)
  return status == 'SUCCESSFUL' or status == 'FAILED'
end

-- ZADD to a sorted set of the protocol's (a queue, a delayed set, the running set);
-- one of another type, written by hand, holds no job of ours and is replaced. No
-- command on the common path: the error is looked at only when the write fails.
local function zadd(key, score, member)
  local added = redis.pcall('ZADD', key, score, member)
  if failed(added) then
    drop_if_spoilt(added, key)
    redis.call('ZADD', key, score, member)
  end
end

-- SADD to a set of the protocol's (the queues used), replaced when of another type.
local function sadd(key, member)
  local added = redis.pcall('SADD', key, member)
  if failed(added) then
    drop_if_spoilt(added, key)
    redis.call('SADD', key, member)
  end
end

-- A key as the type it must be: one that holds another type (spoilt by hand) is
-- deleted, as it holds nothing a script can read.
local function typed(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= kind and found ~= 'none' then
    redis.call('DEL', key)
  end
  return key
end
