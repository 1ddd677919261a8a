-- include: keys, values, queues, new_jobs, unique, handoff
-- Keys: JOB..id, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue, SCHEDULER_WAKE,
--       KNOWN_QUEUES, UNIQUE..key, LIMIT..key, RUNNING, PAUSED, IDLE..queue,
--       IDLE_WORKER..wid, HANDOFF..wid
-- Store jobs and make them READY: each on its queue, or in its queue's delayed set
-- until due. One job or a batch: one call, one round trip. A job READY at once, with
-- no limit, for an empty and unpaused queue that a worker stands idle on, is handed to
-- that worker instead: started under its lease (handoff.lua).
-- ARGV[1] 1 to record the queues' names among the queues used (QUEUES is empty),
-- ARGV[2] the workers' lease (ms), which a handed job starts under,
-- then 6 values per job: id, payload (JSON envelope), queue name, priority
-- (-100..100), due time (ms since the epoch, or 0 for now; a due time Redis's clock
-- has passed queues the job at once), options ('' or JSON: new_jobs.lua's job_options).
-- Returns, per job, the enqueue time (ms), or 0 when a key with its id exists already
-- (that job is skipped, nothing of it changed), or, for a job with a unique key that
-- another job holds, that job's id (the job is not stored).
local record_queues, lease = ARGV[1] == '1', tonumber(ARGV[2])
local now = clock_ms()
local enqueued = {}
local woken, to_wake = {}, {}
for at = 3, #ARGV, 6 do
  local id, payload, queue, priority = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local due, options = tonumber(ARGV[at + 4]), job_options(ARGV[at + 5])
  local holder = options.unique and unique_holder(options.unique)
  if holder then
    enqueued[#enqueued + 1] = holder
  elseif redis.call('EXISTS', JOB .. id) == 1 then
    enqueued[#enqueued + 1] = 0
  else
    local ready = nil
    local worker = lease and due <= now and not options.limit and valid_queue(queue)
                   and idle_worker_for(queue)
    if worker then
      -- As a claim would read the hash the enqueue writes (READ's order).
      local read = {false, payload, false, false, false, now, false, queue,
                    number(priority, 0) ~= 0 and priority or false}
      local written = new_job_fields(payload, queue, priority, now)
      hand_over(id, read, next_score(priority), worker, queue, lease, now, written)
    else
      ready = store_job(id, payload, queue, priority, due, now, options)
    end
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
