-- include: keys, values, broadcasts
-- Keys: WORKERS, BROADCAST..'msg:'..n, BROADCAST_SEQ, CURSORS, UNREAD, SENT
-- A worker records how the broadcast messages it ran ended, then takes the ones it has
-- not read yet, moving its cursor past them: each message is taken once per worker.
-- A message for a queue the worker does not serve is passed over.
-- ARGV[1] worker id, ARGV[2] the queues it serves, comma-separated, ARGV[3] liveness
-- window (ms), ARGV[4] most messages to take, then pairs of message number and
-- outcome (SUCCESSFUL or FAILED) of messages it ran
-- Returns {more, number, payload, ...}: more is 1 when unread messages remain past the
-- ones read (at most ARGV[4], for this worker or not), then the messages to run, in the
-- order sent. A reply with no message may still have more: those read were for queues
-- the worker does not serve.
local worker, window, most = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = clock_ms()
-- Not pcall: an out-of-memory Redis must refuse the whole call (this is its first
-- write), so that the worker sends the outcomes again rather than lose them.
for i = 5, #ARGV, 2 do
  local message = BROADCAST .. 'msg:' .. ARGV[i]
  if redis.call('TYPE', message)['ok'] == 'hash' then
    redis.call('HSET', message, 'ran:' .. worker, ARGV[i + 1] .. ' ' .. now)
  end
end
local cursors, unread = CURSORS, UNREAD
-- Keys of another type (spoilt by hand): nothing to receive, and the worker goes on.
local function usable(key)
  local kind = redis.call('TYPE', key)['ok']
  return kind == 'zset' or kind == 'none'
end
if not usable(cursors) or not usable(unread) then
  return {0}
end
local cursor = tonumber(redis.call('ZSCORE', cursors, worker))
if not cursor then
  -- Not known (its heartbeat has not registered it, or it was silent for a whole
  -- window): it starts from now, as a new worker does.
  redis.call('ZADD', cursors, last_broadcast(), worker)
  return {0}
end
local serves = {}
for queue in string.gmatch(ARGV[2], '[^,]+') do
  serves[queue] = true
end
local taken = {0}
local last = cursor
-- The cursor as an exact decimal: Lua writes large numbers with 14 digits, which
-- would read back below it (and the messages past it be taken again).
local since = '(' .. whole(cursor)
for _, n in ipairs(redis.call('ZRANGEBYSCORE', unread, since, '+inf', 'LIMIT', 0, most)) do
  -- The cursor moves by the scores, which are the numbers: a member written by hand
  -- that is not a number cannot stop it.
  last = math.max(last, number(redis.call('ZSCORE', unread, n), last))
  local message = BROADCAST .. 'msg:' .. n
  local f = redis.pcall('HMGET', message, 'payload', 'queue')
  if not f.err and f[1] and (not f[2] or f[2] == '' or serves[f[2]]) then
    redis.call('HSET', message, 'ran:' .. worker, 'RUNNING ' .. now)
    taken[#taken + 1] = n
    taken[#taken + 1] = f[1]
  end
end
if last > cursor then
  redis.call('ZADD', cursors, last, worker)
  trim_broadcasts(now, window)
end
if redis.call('ZRANGEBYSCORE', unread, '(' .. whole(last), '+inf', 'LIMIT', 0,
              1)[1] then
  taken[1] = 1
end
return taken
