"""A model-based test of periodic jobs: ``lua/periodic.lua`` driven through ``Broker``
and ``PeriodicStep`` against the suite's real redis-server, step by step, while a
Python model says what every schedule's hash, every job and every queue must hold.

Hypothesis' stateful testing chooses the steps among: syncs of changing settings
(schedules added, removed, or changed: interval, cron expression, catch-up, args, a
unique task with or without a ``unique_for`` window; sometimes with an invalid name),
given to every scheduler or to one only (a rolling deploy: the schedulers' settings
differ); edits of one schedule to another timetable (an interval to another, a cron
expression to another, a cron expression to an interval and back, the same instants
by cron and by interval), made some periods after its last run, given to one
scheduler or to all, and followed at once by a step; a scheduler that syncs its
settings again, old ones included (the timetable in force flips back and forth
between schedulers that disagree); three schedulers that each keep the ``last``
Redis last told them and the ``now`` of their last tick, and either make ``run``
calls from what they know and their own settings (a stale ``last`` or ``now``: they
race; with a job's limits or unique key in its options) or take a whole
``PeriodicStep.step``; pause, resume (of a paused schedule or not), run now (as the
dashboard does, with a unique key, or with an id taken); a job that ends (its unique
key freed, left behind, or kept for a window); time passing; spoilt state (garbage
in ``last`` or ``skipped``, a ``last`` in the future, far in the past or before the
epoch, a schedule key or the names set of another type, a job id taken ahead by a
finished job, a state without ``timetable`` as an older version wrote it); Redis
errors injected before a script runs, a call whose reply is lost after it ran, a
real out-of-memory Redis, and SCRIPT FLUSH.

Every script call goes through a broker whose periodic methods report to the model:
it checks what the caller sends (the occurrences ``Schedule.due`` found, against an
independent count of the multiples of the period, with both catch-ups, batches and
the backlog bound; the skipped count; the next occurrence), applies the call to the
model as the header of periodic.lua describes it, and compares the reply. A call
refused (injected error, OOM) must change nothing; a call whose reply is lost
changes what it would have. After each call: ``last`` of no schedule moved backwards
(a valid one: garbage and future values are spoilt state, reset as documented), a
paused schedule stored no job, a sync left no key of a schedule it removed, and the
jobs a run stored are for occurrences of the timetable in force (what the last sync
stored; a caller with other settings stores none) after the moment it was
registered (the sync that brought it, or for a state lost, the ``last`` its caller
went on from): no edit replays a run from before it, whichever scheduler steps. After
every step the invariants read Redis whole: exactly the keys the model expects, each
with its contents and without a TTL (but finished jobs, and a unique key in its
window); each
stored job once (the arrival counter equals the jobs stored, none rewritten: its
score and ``enqueued_at`` are those of its store); each queue exactly its jobs in
order; ``last_job`` an existing job; and for every "all" schedule in force, every
occurrence from its start (or its last reset: resume, a pass while paused, an edit
or any other change of the schedule in force, a caller's catch-up "latest", spoilt
state, the backlog bound) up to ``last`` has a job,
but those skipped while a job of its unique task held the key (counted in
``skipped``).

How the test controls time
--------------------------
The script reads Redis's clock, which the test cannot move. The schedules are small
(every 1 or 2 s, the shortest interval allowed; cron every minute or two, UTC), so
real time makes a few occurrences due during a run, and the rule ``time_passes``
makes many: it moves
a schedule's ``last`` back by k periods (HSET), as if k periods had passed since the
last step, which is all the script and the scheduler look at (the job model moves
scores to 0 the same way); the moment its timetable was registered moves back with
it. The jobs already stored for occurrences in that span
stay: the script must not store them again (their ids are taken), and store the
others, which a bound shorter than the real one (``BATCH`` and ``MAX_BACKLOG`` are
patched to 4 and 10) turns into batches, then into skipped occurrences. No sleep: a
caller's ``now`` is Redis's clock read before its call (or an older one, for a
stale scheduler), so the occurrences it sends are due whatever the script's clock;
what the script stamps with its own clock (a start, a resume, ``last_at``,
``enqueued_at``) is checked to lie between the clock readings around the call.

Where each part is
------------------
- ``machine.py``: ``PeriodicMachine``, the model's state, with the areas below mixed
  in (tests/test_periodic_model.py runs it).
- ``schedules.py``: the schedules a sync may declare, the bounds patched, the options
  and spoilt values, and the arithmetic of periods.
- ``model.py``: the model's reads and its moves as periodic.lua makes them.
- ``calls.py``: ``ModelBroker``, through which every script call is checked: what the
  caller sends, the reply, and what holds after it.
- ``steps.py``: the steps and their operations; ``trouble.py``: Redis errors, lost
  replies, a real OOM, SCRIPT FLUSH.
- ``invariants.py``: what is read from Redis and compared after every step.
"""
