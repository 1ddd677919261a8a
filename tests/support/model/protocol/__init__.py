"""A model-based test of the delivery protocol: the Lua scripts, driven through
``Broker`` against the suite's real redis-server, step by step, while a Python model
says where every job must be.

Hypothesis' stateful testing chooses the steps: enqueues (now, in the past, a few ms
ahead, an hour ahead; through the task API or ``Broker.enqueue``), claims by three
fake workers of 1 to 3 slots each over the queues in various orders (alone or
finishing one of the worker's jobs in the same call), every outcome (SUCCESSFUL,
FAILED, RETRY with a delay, RELEASE), finishes by a wrong owner, heartbeats,
scheduler ticks (with and without recovery, small and large batches), cancels, every
dashboard action, abandon, workers that vanish, claims whose reply is lost, SCRIPT
FLUSH, Redis errors injected before a script, and a real out-of-memory Redis. After every step the
invariants read Redis directly and compare it with the model: each job in exactly one
place with the status, owner, counters, errors, TTL and FIFO place the model says;
the per-queue counts, the failed index, the stats and the wake-up lists agree; no
stray key, and no key left without a TTL but the few the schema keeps for good.

Workers stand idle and are handed jobs (docs/protocol.md, "The hand-off"): a claim
that finds nothing may register its worker as idle on its queues, in its order; an
enqueue of a job READY at once, with no limit, into an empty unpaused queue hands it to
the latest registered idle worker whose claim would take it first (its queues before it empty or
paused), RUNNING under its lease, the claim's reply on its hand-off list; the worker's
wait returns it, or its next claim takes it; a give-back (of every job the worker
owns, or, as a worker stopping while idle, of the handed job only), or a recovery of
its lease, clears the list. A registration runs out (its key's TTL passes): nothing is
handed to that worker any more. A worker of more queues than it registers on (16, empty
ones first) sets idle-wide, and an enqueue past its 16 leaves a wake-up token instead.
After every step each hand-off list holds the job the model handed, each idle key the
first 16 queues of the order it registered, each queue's registry every standing
registration on it, in the order they registered, and a queue with jobs that a worker
stands idle on (registered, or past its 16) holds a wake-up token. Ticks may run "in
grace": their scheduler's step a grace ago ran before any lease ran out, so they
recover nothing and are due again a grace later.

The fan-out is modelled too. Chains and ``depends_on`` (through the task API and
``Broker.enqueue_linked``, on a job in any state, or on one that does not exist) make
waiting jobs: READY, in no queue and no delayed set, until the job they wait for ends
(released at the back of their queue, or into their delayed set, when it succeeded;
FAILED with one ``DependencyFailed`` naming it when it did not, down the chain; a job
enqueued after a FAILED one names the origin its last error names, also one written
by hand, if that is a job id).
Groups of 0 to 5 members (some waiting for other jobs), with or without a callback,
go in batches of two jobs per call (``ENQUEUE_BATCH_JOBS`` is patched), so that
sealing happens in a later call than the first members; the model counts each
member's end once (an operator's retry does not count again), completes the group
when the last sealed member ends, and releases its callback then (or cancels it, for
a cancelled group); cancel_group runs in slices. Broadcasts go to the workers whose
cursor exists (heartbeats register it, receive moves it, unregister drops it, and a
tick, a broadcast or a receive drops the cursors of workers silent for a lease):
each worker receives each message at most once, exactly those sent after it
registered for the queues it serves, and the unread set keeps every message a live
cursor has not passed. A worker's receive loop reads on while a reply says unread
messages remain, also when the messages read were all for other queues (a read of 1
or 2 behind several messages for another queue): once it ends, nothing for its queues
is left unread.

Unique jobs and limits are modelled in limits.py (its docstring says how): enqueues
under unique keys, held until the end or for a window, answered with the holder's id,
and taken again by an operator's retry (also within the window of the job's own earlier
end); jobs of two limit keys whose jobs carry limits of every kind and two periods
(concurrency only, rate only, both; an hour and two hours), so that a key's jobs differ
as after a deploy, whatever state the others are in (running, parked, recovered, given
back); parked by the claims over their own limits counted against every job of the key
(a place of their own) and unparked by a freed slot or the tick's look. After every step
the unique keys, the slots (every RUNNING job of the key), the starts the key keeps and
its window of rates, the parked sets and the looks agree with the model, no job started
beside more jobs of its key than its max_running, and no parked job is left without a
look or a slot holder to bring it back.

Each worker is a process of 1 to 3 slots (``runworker --threads N``), modelled in
slots.py: it claims only with a slot free (a claim carrying an outcome frees that
job's slot first; with every slot busy the call only stores), registers as idle only
then, and is handed at most one job per registration, into the slot left free. Each
slot ends its own job (finished, failed, retried, given back, or its lease run out and
its late outcome refused) while the others run on; one heartbeat renews them all; a
give-back after a lost claim or wait reply keeps the attempts of the other slots (job
id and owner token: a job the lost call claimed again, beside a slot still running it
after its lease ran out, goes back) and gives back only what the lost call gave (and
what the worker forgot). After every step no
worker holds more jobs than its slots, one registered as idle has a slot free, no job a
give-back keeps is given back, and every job Redis says a worker runs is in one of its
slots or one it forgot.

A fresh job (enqueue.lua, no option, due now) is kept as an entry in its bucket, and a
step rewrites a waiting job in the other form, as the other process of a deploy stores
it, at the same place (tests/support/entries.py): every script reads either form,
whatever its place says. After every step a job has one form, an entry only while it
waits on its queue and until a script made it its hash, never back; an entry parses to
the fields the model says.

Outbox relays are modelled in relays.py: relays store jobs and record their ids, a
finished job's result expires, a row is relayed again whatever its job became (stored
nothing), and a relay forgets the records of the rows it deleted.

How the test controls time
--------------------------
The scripts read Redis's clock (TIME), which a test cannot move. So:

- Leases never run out by themselves: the broker under test has a one-hour lease.
  A lease runs out only when the ``lease_runs_out`` step moves that job's deadline
  into the past in the running zset (ZADD score 0), which simulates time passing for
  that job alone. The model knows per job whether its lease has passed. A worker
  falls silent for a lease the same way: ``worker_goes_away`` moves its last
  heartbeat in ``{P}:workers`` to 0.
- Due times: a job due an hour ahead is due only when the ``becomes_due`` step moves
  its score in ``{P}:delayed:<queue>`` to 0 (same trick). Jobs due in the past, now
  (RETRY in 0 ms) or SOON (20 ms) ahead are left to real time: the model learns each
  due time from the delayed zset (checking it lies in the window of Redis clock
  readings around the call that set it), and between two steps the test sleeps until
  Redis's clock has passed every SOON due time, of delayed and of waiting jobs
  (``let_time_pass``; the only real sleep, 20 ms at most, in the few steps that set
  such a due time). It also waits for the clock to reach the next ms, so no two steps
  share one.
- So no step depends on how fast the previous ones ran: a job SOON due is due from
  the next step on; finish times and lease deadlines of different steps differ. Where
  a script's own clock reading still decides (a due time falling between the Redis
  clock readings taken just before and just after an enqueue, a tick or a release:
  an enqueue slower than 20 ms), the model accepts exactly the outcomes some instant
  of that window would give, and follows the one Redis took.

Job ids are made deterministic (``backends.base.new_job_id`` is replaced during the test by
a counter hashed into an id), so that a failing sequence replays with the same ids,
and so the same ties between equal scores.

Where each part is
------------------
- ``machine.py``: ``ProtocolMachine``, the model's state, with the areas below mixed
  in (tests/test_protocol_model.py runs it).
- ``records.py``: the queues, workers, times, errors, places and limits; the records
  of a job, a group, a message, a start. ``strategies.py``: what the rules draw from.
- ``core_model.py``, ``core_operations.py``, ``core_rules.py``: the core moves
  (enqueue, claim, finish, heartbeat, tick, cancel, operate, abandon, watch): the
  model's moves as the shared Lua files make them, the broker calls checked against them, and
  the rules that make those calls.
- ``fanout.py``: chains, ``depends_on`` and groups; ``broadcasts.py``: broadcasts and
  receive; ``limits.py``: unique jobs and limits (each: moves, operations, rules).
- ``relays.py``: the outbox's relay records, and results that expire.
- ``slots.py``: workers of several slots: their rules and their invariant.
- ``trouble.py``: SCRIPT FLUSH, errors before a script, a real OOM, lost replies.
- ``invariants.py``: what is read from Redis and compared after every step.
"""
