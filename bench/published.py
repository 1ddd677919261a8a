"""What each system's own project publishes about its speed, and how this sitting's
figures compare: the "Published figures" section of ``results.md``.

Each entry is a function of ``median(system, metric)`` (None when the sitting has no such
figure), so that the comparison is made with the figures of the report it is part of.
The sources were read in November 2026 (RQ at aa666a8, arq at 3914e48, Dramatiq at
848b35f, Huey at 358bdc5, Celery's README and docs of 5.6).
"""

from __future__ import annotations

from collections.abc import Callable

Median = Callable[[str, str], float | None]

# RQ's microbenchmark: 1,000 jobs drained by a burst worker, start-up included.
RQ_SIMPLE = 1000 / 1.02
RQ_FORK = 1000 / 6.64
# A one-off check of RQ's forking Worker with this harness (2,000 jobs, one worker, the
# drain's measure), for the gap RQ's benchmark shows; the table runs SimpleWorker only.
RQ_FORK_HERE = (87.1, 452.6, "2026-11-23")
CELERY_MILLIONS_A_MINUTE = 1_000_000 / 60  # jobs/s for one million a minute
TIMES = "\N{MULTIPLICATION SIGN}"


def rate(value: float | None) -> str:
    return "no figure" if value is None else f"{value:,.0f} jobs/s"


def times(a: float | None, b: float | None) -> str:
    """``a`` over ``b``, followed by the multiplication sign."""
    if a is None or not b:
        return "?"
    return f"{a / b:.2g}{TIMES}"


def redisqueue(median: Median) -> str:
    return (
        "Publishes no figures of its own beyond this benchmark (the README quotes "
        "`bench/results/`, and `bench/core.py` measures this app alone), so there is "
        "nothing independent to compare with."
    )


def rq(median: Median) -> str:
    ours = median("rq", "drain_one")
    fork, simple, day = RQ_FORK_HERE
    return (
        'Its README ("Notes on Performance") and `docs/benchmark.md` give a hello-world '
        f"microbenchmark: 1,000 jobs drained in 1.02 s by `SimpleWorker` ({RQ_SIMPLE:,.0f} "
        f"jobs/s) against 6.64 s by the default forking `Worker` ({RQ_FORK:,.0f} jobs/s), "
        "on an M4 MacBook Air, Python 3.13, Redis 7.2, worker start-up included, "
        '"illustrative only". '
        f"Here `SimpleWorker` drains {rate(ours)}, {times(ours, RQ_SIMPLE)} the published "
        "figure on a 2-core VM; the forking `Worker`, left out of the table, drained "
        f"{fork:.0f} jobs/s against {simple:.0f} for `SimpleWorker` in a one-off check with "
        f"this harness's drain ({day}, 2,000 jobs): {times(simple, fork)}, near the "
        f"{times(RQ_SIMPLE, RQ_FORK)} RQ publishes."
    )


def celery(median: Median) -> str:
    one, latency = median("celery", "drain_one"), median("celery", "latency_p50")
    per_minute = "no figure" if one is None else f"{one * 60:,.0f} a minute"
    return (
        'Its README and introduction say "A single Celery process can process millions '
        "of tasks a minute, with sub-millisecond round-trip latency (using RabbitMQ, "
        'librabbitmq, and optimized settings)"; no benchmark or figure is published for '
        "the Redis broker. Here, on Redis, one solo-pool process drains "
        f"{rate(one)} ({per_minute}; one million a minute would be "
        f"{CELERY_MILLIONS_A_MINUTE:,.0f} jobs/s), and the idle latency p50 is "
        + ("no figure" if latency is None else f"{latency:.2f} ms")
        + ": a different broker and client library, so not a like-for-like check of the "
        "claim."
    )


def huey(median: Median) -> str:
    return (
        "Publishes no throughput or latency figures (README, docs); its consumer docs "
        "only advise raising `-w` above the default 1 for throughput. Nothing to compare."
    )


def dramatiq(median: Median) -> str:
    ours, celery_ = median("dramatiq", "drain_default"), median("celery", "drain_default")
    return (
        "Publishes no figures: its repository has a Celery-against-Dramatiq benchmark "
        'script (`benchmarks/`, "take it with a grain of salt. Dramatiq has an advantage '
        "over Celery in most of these benchmarks by design\") but no results, and its docs' "
        "one throughput advice is to install hiredis (done here). At their default "
        f"concurrency here Dramatiq drains {rate(ours)} against Celery's {rate(celery_)} "
        f"({times(ours, celery_)})."
    )


def arq(median: Median) -> str:
    ours, rq_ = median("arq", "drain_one"), median("rq", "drain_one")
    return (
        'Its docs say "Asyncio and no forking make arq around 7x faster than rq for short '
        'jobs with no io. With io that might increase to around 40x faster. (TODO)", with '
        "no figures or benchmark behind it. Here one arq worker drains "
        f"{rate(ours)}, {times(ours, rq_)} RQ's `SimpleWorker` ({rate(rq_)}); the claim "
        f"is against RQ's forking `Worker` (about {RQ_FORK_HERE[0]:.0f} jobs/s here in a "
        "one-off check). arq's drain is bound by its poll (100 jobs per 0.5 s), not by "
        "Redis or the CPU."
    )


def bare(median: Median) -> str:
    return "Not a project: a floor written for this benchmark, nothing published."


PUBLISHED: dict[str, Callable[[Median], str]] = {
    "redisqueue": redisqueue,
    "rq": rq,
    "celery": celery,
    "huey": huey,
    "dramatiq": dramatiq,
    "arq": arq,
    "bare": bare,
}
