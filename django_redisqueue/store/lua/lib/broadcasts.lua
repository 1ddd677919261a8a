-- include: keys, values
-- Broadcast messages (docs/protocol.md, "Fan-out"): the number of the last one, and
-- the trim of dead workers' cursors and of the messages every live worker has read.

-- The number of the last broadcast message: the counter's, or past it the highest
-- number a cursor, an unread message or the last message sent holds, so that a
-- counter holding garbage, or deleted, never numbers a message below a cursor (which
-- would pass over it) nor reuses a number. A key of another type counts for none.
local function last_broadcast()
  local highest = number(redis.pcall('GET', BROADCAST_SEQ), 0)
  for _, key in ipairs({CURSORS, UNREAD, SENT}) do
    local top = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    if not top.err then -- SENT is scored by time: its member is the number
      highest = math.max(highest, number(key == SENT and top[1] or top[2], 0))
    end
  end
  return math.floor(highest)
end

-- Drop the cursors of workers silent for `window` ms (dead: they must not hold
-- messages for ever), then the broadcast messages every remaining worker has read.
-- With no live worker left, no message will be read: all go.
local function trim_broadcasts(now, window)
  local cursors, unread = CURSORS, UNREAD
  -- Keys of another type (spoilt by hand) are left alone: a hint must not stop a step.
  for _, key in ipairs({cursors, unread, WORKERS}) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'zset' and kind ~= 'none' then
      return
    end
  end
  for _, worker in ipairs(redis.call('ZRANGE', cursors, 0, -1)) do
    local seen = tonumber(redis.call('ZSCORE', WORKERS, worker))
    if not seen or seen < now - window then
      redis.call('ZREM', cursors, worker)
    end
  end
  local lowest = redis.call('ZRANGE', cursors, 0, 0, 'WITHSCORES')[2]
  if lowest then
    redis.call('ZREMRANGEBYSCORE', unread, '-inf', lowest)
  else
    redis.call('DEL', unread)
  end
end
