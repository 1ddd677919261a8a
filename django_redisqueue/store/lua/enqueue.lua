-- include: keys, values, new_jobs, unique, handoff, relays
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue,
--       SCHEDULER_WAKE, KNOWN_QUEUES, UNIQUE..key, LIMIT..key, RUNNING, PAUSED,
--       IDLE..queue, IDLE_WORKER..wid, IDLE_WIDE, HANDOFF..wid, HANDED, RELAYED,
--       FAIR..queue
-- Store jobs and make them READY: each on its queue, or in its queue's delayed set
-- until due; a fresh job (no options, due now) kept as an entry, any other as a hash
-- (new_jobs.lua). One job or a batch: one call, one round trip. Then the first jobs of a
-- queue that held none before the call, unpaused, with no limit, go to the idle
-- workers whose claim would take them: started, in HANDED until the worker takes
-- them (handoff.lua).
-- ARGV[1] 1 to record the queues' names among the queues used (QUEUES is empty),
-- ARGV[2] how long (ms) a handed job waits for its worker to take it, after which the
--   scheduler gives it back (its short lease in HANDED),
-- ARGV[3] 1 when an outbox relay sends the jobs: one relayed before stores nothing
--   (relays.lua),
-- then 6 values per job: id, payload (JSON envelope), queue name, priority
-- (-100..100), due time (ms since the epoch, or 0 for now; a due time Redis's clock
-- has passed queues the job at once), options ('' or JSON: new_jobs.lua's job_options).
-- Returns, per job, the enqueue time (ms), or 0 when its id is taken (a key or an entry)
-- or, for a relay, the job was relayed before (that job is skipped, nothing of it
-- changed), or, for a job with a unique key that another job holds, that job's id
-- (the job is not stored).
local record_queues, lease, relay = ARGV[1] == '1', tonumber(ARGV[2]), ARGV[3] == '1'
local now = clock_ms()
local enqueued = {}
local filled, added = {}, {}
for at = 4, #ARGV, 6 do
  local id, payload, queue, priority = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local due, options = tonumber(ARGV[at + 4]), job_options(ARGV[at + 5])
  -- A job relayed before, or whose unique key another job holds, is not stored: its
  -- reply is 0, or the holder's id.
  local skipped = relay and relayed_before(id) and 0
  local holder = skipped or (options.unique and unique_holder(options.unique))
  if relay then
    record_relay(id, now)
  end
  -- A fresh job (no options, due now) is kept as an entry, whose write refuses an id
  -- an entry holds: its id needs one look less.
  local fresh = ARGV[at + 5] == '' and due <= now
  if holder then
    enqueued[#enqueued + 1] = holder
  elseif fresh and redis.call('EXISTS', JOB .. id) == 1 or not fresh and id_taken(id) then
    enqueued[#enqueued + 1] = 0
  else
    local ready = store_job(id, payload, queue, priority, due, now, options, fresh)
    if ready == false then -- an entry holds its id
      enqueued[#enqueued + 1] = 0
    else
      if options.unique then
        hold_unique(id, options, now)
      end
      if ready then
        if not added[ready] then
          filled[#filled + 1] = ready
        end
        added[ready] = (added[ready] or 0) + 1
      end
      if record_queues then
        sadd(KNOWN_QUEUES, queue)
      end
      enqueued[#enqueued + 1] = now
    end
  end
end
-- Once the whole call is in place, so that no job is handed past a job of higher
-- priority that the same call brings: the first jobs of the queues it filled go to
-- idle workers whose claim would take them, then one wake-up for each queue that
-- still holds jobs.
for _, queue in ipairs(filled) do
  if not lease or hand_queued(queue, added[queue], lease, now) > 0 then
    leave_wake_token(WAKE .. queue)
  end
end
return enqueued
