-- include: keys, values, broadcasts
-- Keys: WORKERS, BROADCAST..'msg:'..n, BROADCAST..'wake:'..worker, BROADCAST_SEQ,
--       CURSORS, UNREAD, SENT
-- Send a message to every live worker, or to those serving a queue: each runs its task
-- once (receive.lua). Pull messaging, as in seed 004: each worker keeps a cursor, the
-- number of the last message it read.
-- ARGV[1] payload (JSON envelope), ARGV[2] queue name ('' for every worker),
-- ARGV[3] result TTL (s), ARGV[4] liveness window (ms): a worker silent that long is
-- dead and does not hold messages
-- Returns the message's number.
-- Nothing stored stops a send half-way: the broadcast keys of another type (spoilt by
-- hand) are replaced, and the message's number is past every number a cursor or an
-- unread message holds, whatever the counter holds (garbage, or deleted).
local now, ttl = clock_ms(), tonumber(ARGV[3])
local cursors, unread, sent = typed(CURSORS, 'zset'), typed(UNREAD, 'zset'), typed(SENT, 'zset')
local n = whole(last_broadcast() + 1)
redis.call('SET', BROADCAST_SEQ, n)
local message = BROADCAST .. 'msg:' .. n
redis.call('DEL', message)
redis.call('HSET', message, 'payload', ARGV[1], 'queue', ARGV[2], 'sent_at', now)
redis.call('EXPIRE', message, ttl)
-- Every live worker reads it: one without a cursor (its cursors lost, replaced or
-- deleted by hand, since its heartbeat set one) gets one, from just before it.
local window = tonumber(ARGV[4])
local live = redis.pcall('ZRANGEBYSCORE', WORKERS, now - window, '+inf')
for _, worker in ipairs(failed(live) and {} or live) do
  if not redis.call('ZSCORE', cursors, worker) then
    redis.call('ZADD', cursors, n - 1, worker)
  end
end
redis.call('ZADD', unread, n, n)
redis.call('EXPIRE', unread, ttl)
redis.call('ZADD', sent, now, n)
redis.call('ZREMRANGEBYSCORE', sent, '-inf', now - ttl * 1000)
redis.call('EXPIRE', sent, ttl)
trim_broadcasts(now, window)
-- Wake the idle workers that will read it (the busy ones see it at their next claim).
for _, worker in ipairs(redis.call('ZRANGE', cursors, 0, -1)) do
  local wake = BROADCAST .. 'wake:' .. worker
  leave_wake_token(wake)
  redis.call('EXPIRE', wake, 60)
end
return n
