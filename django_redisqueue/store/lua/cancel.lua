-- include: values, outcome
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue, SCHEDULER_WAKE,
--       FAILED..queue, STATS..minute, GROUP..gid, UNIQUE..key, LIMIT..key, FAIR..queue
-- Cancel a job that has not started (queued, delayed, or waiting for another job or
-- its group): take it off its queue or delayed set and record it as FAILED with the
-- given error. A cancelled job stays out of the failed index; the jobs that waited for
-- it fail with DependencyFailed.
-- ARGV[1] job id, ARGV[2] result TTL (s), ARGV[3] error JSON
-- Returns 'CANCELLED', or the job's status when it cannot be cancelled ('' if none).
return cancel_job(ARGV[1], ARGV[3], clock_ms(), tonumber(ARGV[2]))
