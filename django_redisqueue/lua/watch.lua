-- Ask to be woken when a job finishes, unless it has finished already.
-- KEYS[1] job hash
-- Returns the job's status, or '' when there is no such job.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return ''
end
if status ~= 'SUCCESSFUL' and status ~= 'FAILED' then
  redis.call('HSET', KEYS[1], 'waiters', 1)
end
return status
