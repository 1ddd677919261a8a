"""Turn the peer benchmark's figures into ``results.md`` and ``chart.png``.

.venv/bin/python -m bench.report [bench/results/results.json]   # redraw from the JSON
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.published import PUBLISHED

DASH, TIMES = "\N{EN DASH}", "\N{MULTIPLICATION SIGN}"


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    title: str
    unit: str
    higher_is_better: bool
    log: bool = False  # log scale on the chart: the values span orders of magnitude
    same_as_one: str = ""  # the ONE metric that stands in when the default is one at a time
    sum_of: tuple[str, ...] = ()  # a figure made of others: their sum, run by run


METRICS = [
    Metric("enqueue_one", "Enqueue, one at a time", "jobs/s", True),
    Metric("enqueue_bulk", "Enqueue, bulk call", "jobs/s", True, log=True),
    Metric("enqueue_commit", "Enqueue on commit, 1,000 per transaction", "jobs/s", True),
    Metric("drain_one", "Drain, one job at a time", "jobs/s", True, log=True),
    Metric("drain_default", "Drain, default concurrency", "jobs/s", True, True, "drain_one"),
    Metric("drain_four", "Drain, 4 processes", "jobs/s", True, log=True),
    Metric("enqueue_commands", "Redis commands per enqueued job", "calls", False),
    Metric("drain_commands", "Redis commands per drained job", "calls", False),
    Metric("enqueue_cpu", "Redis CPU per enqueued job", "µs", False),
    Metric("drain_cpu", "Redis CPU per drained job", "µs", False),
    Metric(
        "total_cpu",
        "Redis CPU per job, enqueue + drain",
        "µs",
        False,
        sum_of=("enqueue_cpu", "drain_cpu"),
    ),
    Metric("drain_four_cpu", "Redis CPU per drained job, 4 processes", "µs", False),
    Metric("drain_worker_cpu", "Worker CPU per drained job, one at a time", "µs", False),
    Metric("latency_p50", "Idle latency p50", "ms", False, log=True),
    Metric("latency_p95", "Idle latency p95", "ms", False, log=True),
    Metric("latency_p99", "Idle latency p99", "ms", False, log=True),
    Metric("lateness_p50", "Delayed lateness p50", "ms", False, log=True),
    Metric("lateness_p99", "Delayed lateness p99", "ms", False, log=True),
    Metric("memory_per_job", "Redis memory per waiting job", "bytes", False),
    Metric("rss_one", "Worker RSS at rest, 1 process", "MiB", False),
    Metric("rss_default", "Worker RSS at rest, default", "MiB", False, False, "rss_one"),
    Metric("pss_default", "Worker PSS at rest, default", "MiB", False, False, "pss_one"),
    Metric("io32_rate", "50 ms waits, 32 at once, one worker", "jobs/s", True),
    Metric("io32_pss", "Worker PSS, 32 waits at once", "MiB", False),
    Metric("io256_rate", "500 ms waits, 256 at once, one worker", "jobs/s", True),
    Metric("io256_pss", "Worker PSS, 256 waits at once", "MiB", False),
]
HOME = "redisqueue"  # ratios are each system's figure over this one's


def values(data: dict[str, Any], system: str, metric: Metric) -> list[float]:
    figures = data["figures"].get(system, {})
    if metric.sum_of:
        parts = [figures.get(key, []) for key in metric.sum_of]
        if not all(parts):
            return []
        if len({len(part) for part in parts}) == 1:  # one of each per run: sum run by run
            return [sum(run) for run in zip(*parts, strict=True)]
        return [sum(statistics.median(part) for part in parts)]  # a run failed: medians
    stands_in = metric.same_as_one and data["systems"][system]["default_is_one"]
    if metric.key not in figures and stands_in:
        return figures.get(metric.same_as_one, [])
    return figures.get(metric.key, [])


def median(data: dict[str, Any], system: str, key: str) -> float | None:
    """The median of one of the sitting's figures, or None."""
    metric = next((m for m in METRICS if m.key == key), Metric(key, key, "", True))
    found = values(data, system, metric) if system in data["systems"] else []
    return statistics.median(found) if found else None


def number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def cell(data: dict[str, Any], system: str, metric: Metric) -> str:
    found = values(data, system, metric)
    if not found:
        return DASH
    median = statistics.median(found)
    text = f"{number(median)} ({number(min(found))}{DASH}{number(max(found))})"
    home = values(data, HOME, metric)
    if system != HOME and home and statistics.median(home):
        text += f" **{TIMES}{ratio(median / statistics.median(home))}**"
    return text


def table(data: dict[str, Any]) -> list[str]:
    systems = list(data["systems"])
    titles = [data["systems"][name]["title"] for name in systems]
    lines = [
        "| figure | better | " + " | ".join(titles) + " |",
        "|---|---|" + "---|" * len(systems),
    ]
    for metric in METRICS:
        better = "higher" if metric.higher_is_better else "lower"
        cells = [cell(data, name, metric) for name in systems]
        lines.append(f"| {metric.title} ({metric.unit}) | {better} | " + " | ".join(cells) + " |")
    return lines


def joined(texts: list[str], runs: int) -> str:
    """A note made in several runs, on one line: "3 processes", or "cut short after
    30 s in 2 of 3 runs: 17,985 of 20,000 jobs, 15,427 of 20,000 jobs"."""
    heads = {text.partition(": ")[0] for text in texts}
    if len(heads) > 1 or ": " not in texts[0]:
        return "; ".join(dict.fromkeys(texts))
    tails = [text.partition(": ")[2] for text in texts]
    tail = ", ".join(tails) if len(set(tails)) > 1 else tails[0] + " each" * (len(tails) > 1)
    return f"{heads.pop()} in {len(texts)} of {runs} runs: {tail}"


def notes(data: dict[str, Any]) -> list[str]:
    titles = {metric.key: metric.title for metric in METRICS}
    found = [
        f"- {data['systems'][name]['title']}, {titles[key]}: {joined(texts, data['runs'])}"
        for name, per_metric in data["notes"].items()
        for key, texts in per_metric.items()
        if key in titles
    ]
    same = [s["title"] for s in data["systems"].values() if s["default_is_one"]]
    if same:
        found.append(
            f"- {', '.join(same)}: the default concurrency is one job at a time, so the "
            "default rows repeat the one-at-a-time figures."
        )
    return found + [f"- FAILED: {failure}" for failure in data.get("failures", [])]


def workloads(data: dict[str, Any]) -> list[str]:
    """What each row measures, with the job counts of this sitting."""
    p = {key: f"{value:,g}" for key, value in data["parameters"].items()}
    return [
        f"- **Enqueue**: {p['enqueue_jobs']} no-op jobs without arguments, one call each, "
        "from one process, after 20 warm-up jobs; bulk: the system's own bulk call; on "
        "commit: queued inside `transaction.atomic()` blocks of 1,000 jobs, sent at each "
        "commit (django-redisqueue only).",
        f"- **Drain**: {p['drain_jobs']} no-op jobs enqueued first, then one worker; the "
        "rate runs from the first job's start to the last job's end as the jobs stamped "
        f"them, so start-up is excluded. A drain still running after {p['drain_cap']} s "
        "is stopped and rated on the jobs it ran.",
        "- **Default concurrency**: the system's default on this 2-core machine (this app: "
        "`--concurrency 2`, one process per core).",
        "- **4 processes**: the same drain with four worker processes, each running one "
        "job at a time, started the way each system documents (see the set-up below); "
        "the machine has 2 cores, shared with Redis.",
        "- **Redis commands per job**: the calls `INFO commandstats` counts (a script "
        "counts once itself and once for each command it runs), less the measurement's "
        "own `INFO`, over the timed enqueue one at a time, and over the drain from its "
        "first job to its last, divided by the jobs enqueued or run in that stretch.",
        "- **Redis CPU per job**: the redis-server's `used_cpu_sys + used_cpu_user` over "
        "the same stretches, divided the same way; the sum row adds enqueue and drain "
        "(one job at a time) run by run.",
        "- **Worker CPU per drained job**: the user and system CPU of the worker's "
        "process tree over the same stretch of the one-at-a-time drain, divided by the "
        "jobs it ran: what the queue's own code costs around a job that does nothing.",
        f"- **Idle latency**: the default set-up plus what runs delayed jobs, idle for 2 s "
        f"after a warm-up job; {p['latency_jobs']} jobs at {p['latency_rate']} per second, "
        "each given `time.time()` taken just before its enqueue call; start minus that.",
        f"- **Delayed lateness**: then {p['delayed_jobs']} jobs due evenly over "
        f"{p['delayed_span']} s, enqueued from {p['delayed_lead']} s ahead with the "
        "system's own delay call; start minus due.",
        f"- **Redis memory**: `used_memory` after {p['memory_jobs']} waiting jobs with one "
        "small argument (their number), minus before, divided; no worker running.",
        "- **Worker RSS/PSS**: the worker's process tree once started and idle, before any "
        "job; RSS counts pages shared by forked processes in each of them, PSS divides them.",
        f"- **Waits, many at once**: one worker set up to run 32 (256) jobs at a time, its "
        "own way (see the set-up below), started and left to settle, then "
        f"{p.get('io32_jobs', '?')} ({p.get('io256_jobs', '?')}) jobs that each wait "
        "50 ms (500 ms) enqueued from 4 processes; the rate runs from the first job's start "
        "to the last job's end (ideal: 640 and 512 jobs/s); the PSS is the highest of "
        "the worker's process tree, sampled every 0.5 s while the jobs run. A system with "
        "no way to run many jobs at once in one worker is left out.",
    ]


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"Median of {data['runs']} runs (min{DASH}max), and **{TIMES}ratio**: the system's "
        "median over django-redisqueue's."
        + ("" if data["scale"] == 1 else f" Job counts scaled by {data['scale']}.")
        + (
            " Each job also made one Redis INCR (`--job-body redis`)."
            if data.get("job_body") == "redis"
            else ""
        ),
        "",
        *table(data),
    ]
    found = notes(data)
    if found:
        lines += ["", "Notes:", "", *found]
    lines += ["", "Workloads:", "", *workloads(data)]
    lines += ["", "Set-up of each system:", ""]
    lines += [
        f"- **{s['title']}**: {s['settings']}"
        + (f". Waits, many at once: {s['io_settings']}" if s.get("io_settings") else "")
        for s in data["systems"].values()
    ]
    lines += [
        "",
        "Published figures: what each project says of its own speed, and how the "
        "figures above compare:",
        "",
    ]
    lines += [
        f"- **{s['title']}**: {PUBLISHED[name](lambda system, key: median(data, system, key))}"
        for name, s in data["systems"].items()
        if name in PUBLISHED
    ]
    lines += ["", "Versions:", ""]
    lines += [f"- {name} {version}" for name, version in data["versions"].items()]
    lines += ["", f"Run on {data['date']} with `{data['command']}` in {data['duration']}."]
    return "\n".join(lines) + "\n"


def chart(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    systems = list(data["systems"])
    titles = [data["systems"][name]["title"] for name in systems]
    columns = 4
    rows = -(-len(METRICS) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows))
    for ax, metric in zip(axes.flat, METRICS, strict=False):
        medians, low, high, colors = [], [], [], []
        for name in systems:
            found = values(data, name, metric)
            median = statistics.median(found) if found else 0.0
            medians.append(median)
            low.append(median - min(found) if found else 0.0)
            high.append(max(found) - median if found else 0.0)
            colors.append("#c0392b" if name == HOME else "#7f8c8d")
        positions = range(len(systems))
        ax.barh(positions, medians, xerr=[low, high], color=colors, capsize=2)
        ax.set_yticks(list(positions), titles, fontsize=8)
        ax.invert_yaxis()
        if metric.log and any(m > 0 for m in medians):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # they overlap the major labels
        better = "higher" if metric.higher_is_better else "lower"
        ax.set_title(f"{metric.title}\n{metric.unit}, {better} is better", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        left = ax.get_xlim()[0]
        for y, median, above in zip(positions, medians, high, strict=True):
            label = f" {number(median)}" if median else " n/a"
            ax.text(median + above or left, y, label, va="center", fontsize=7)  # past the bar
    for ax in list(axes.flat)[len(METRICS) :]:
        ax.axis("off")
    fig.suptitle(
        f"django-redisqueue and its peers: median of {data['runs']} runs, bars min{DASH}max "
        f"({data['date']})",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the title
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(data: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "results.md").write_text(markdown(data))
    chart(data, out / "chart.png")


if __name__ == "__main__":
    source = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/results.json")
    write(json.loads(source.read_text()), source.parent)
