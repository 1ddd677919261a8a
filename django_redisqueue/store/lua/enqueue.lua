-- include: keys, values, new_jobs, unique
-- Keys: JOB..id, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue, SCHEDULER_WAKE,
--       KNOWN_QUEUES, UNIQUE..key, LIMIT..key
-- Store jobs and make them READY: each on its queue, or in its queue's delayed set
-- until due. One job or a batch: one call, one round trip.
-- ARGV[1] 1 to record the queues' names among the queues used (QUEUES is empty),
-- then 6 values per job: id, payload (JSON envelope), queue name, priority
-- (-100..100), due time (ms since the epoch, or 0 for now; a due time Redis's clock
-- has passed queues the job at once), options ('' or JSON: new_jobs.lua's job_options).
-- Returns, per job, the enqueue time (ms), or 0 when a key with its id exists already
-- (that job is skipped, nothing of it changed), or, for a job with a unique key that
-- another job holds, that job's id (the job is not stored).
local record_queues = ARGV[1] == '1'
local now = clock_ms()
local enqueued = {}
local woken, to_wake = {}, {}
for at = 2, #ARGV, 6 do
  local id, payload, queue, priority = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local due, options = tonumber(ARGV[at + 4]), job_options(ARGV[at + 5])
  local holder = options.unique and unique_holder(options.unique)
  if holder then
    enqueued[#enqueued + 1] = holder
  elseif redis.call('EXISTS', JOB .. id) == 1 then
    enqueued[#enqueued + 1] = 0
  else
    local ready = store_job(id, payload, queue, priority, due, now, options)
    if options.unique then
      hold_unique(id, options, now)
    end
    if ready and not woken[ready] then
      woken[ready] = true
      to_wake[#to_wake + 1] = ready
    end
    if record_queues then
      sadd(KNOWN_QUEUES, queue)
    end
    enqueued[#enqueued + 1] = now
  end
end
-- One wake-up per queue, after the whole batch is in place.
for _, queue in ipairs(to_wake) do
  leave_wake_token(WAKE .. queue)
end
return enqueued
