"""Access logs: a synthetic sample, the split into chunks, the counts of a chunk and
their merge. Plain functions; the tasks and views move the data around."""

import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

CHUNK_LINES = 500  # lines per chunk, so per job of the group
PROGRESS_EVERY = 100  # lines between two progress reports of a chunk's job
TOP = 10  # paths and clients kept in a summary

# Common Log Format, optionally followed by the referrer and user agent ("combined").
LINE = re.compile(
    r'(?P<client>\S+) \S+ \S+ \[[^\]]*\] "[A-Z]+ (?P<path>\S+)[^"]*" (?P<status>\d{3})\b'
)

PATHS = {  # path: weight
    "/": 30,
    "/products/": 20,
    "/products/1/": 8,
    "/products/2/": 6,
    "/products/3/": 4,
    "/cart/": 6,
    "/checkout/": 3,
    "/login/": 4,
    "/static/shop.css": 12,
    "/static/shop.js": 12,
    "/favicon.ico": 5,
    "/api/stock/": 4,
    "/wp-login.php": 1,  # scanners: always 404
}
STATUSES = {"200": 85, "304": 7, "302": 3, "404": 3, "500": 2}
POSTED = {"/cart/", "/checkout/", "/login/"}


def sample_log(lines: int) -> str:
    """``lines`` made-up access-log lines: a few busy clients, many quiet ones."""
    rng = random.Random()
    clients = [f"203.0.113.{n}" for n in range(1, 21)] + [f"198.51.100.{n}" for n in range(1, 61)]
    client_weights = [1 / rank for rank in range(1, len(clients) + 1)]
    at = datetime.now(UTC) - timedelta(seconds=lines)
    out = []
    for client, path, status in zip(
        rng.choices(clients, client_weights, k=lines),
        rng.choices(list(PATHS), list(PATHS.values()), k=lines),
        rng.choices(list(STATUSES), list(STATUSES.values()), k=lines),
        strict=True,
    ):
        at += timedelta(seconds=rng.random() * 2)
        method = "POST" if path in POSTED and rng.random() < 0.3 else "GET"
        status = "404" if path == "/wp-login.php" else status
        out.append(
            f'{client} - - [{at:%d/%b/%Y:%H:%M:%S +0000}] "{method} {path} HTTP/1.1" '
            f'{status} {rng.randint(200, 40_000)} "-" "Mozilla/5.0"'
        )
    return "\n".join(out) + "\n"


def log_lines(text: str) -> list[str]:
    """The log's lines, blank ones left out."""
    return [line for line in text.splitlines() if line.strip()]


def chunks(lines: list[str], size: int = CHUNK_LINES) -> list[str]:
    """The lines in slices of ``size``, each joined back into text."""
    return ["\n".join(lines[start : start + size]) for start in range(0, len(lines), size)]


def count(text: str, progress: Callable[[int, int], None] | None = None) -> dict:
    """A chunk's counts, as plain JSON: lines, unparsed lines, and occurrences of each
    status code, path and client. ``progress(lines counted, lines)`` is told every
    ``PROGRESS_EVERY`` lines, and at the end."""
    statuses: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    clients: Counter[str] = Counter()
    lines = unparsed = 0
    every = log_lines(text)
    for line in every:
        lines += 1
        if progress is not None and (lines % PROGRESS_EVERY == 0 or lines == len(every)):
            progress(lines, len(every))
        match = LINE.match(line)
        if match is None:
            unparsed += 1
            continue
        statuses[match["status"]] += 1
        paths[match["path"]] += 1
        clients[match["client"]] += 1
    return {
        "lines": lines,
        "unparsed": unparsed,
        "statuses": dict(statuses),
        "paths": dict(paths),
        "clients": dict(clients),
    }


def merge(counts: Iterable[dict]) -> dict:
    """The summary of chunks' counts: totals, every status code, the top paths and
    clients (most frequent first, ties by name)."""
    lines = unparsed = 0
    statuses: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    clients: Counter[str] = Counter()
    for chunk in counts:
        lines += chunk["lines"]
        unparsed += chunk["unparsed"]
        statuses.update(chunk["statuses"])
        paths.update(chunk["paths"])
        clients.update(chunk["clients"])
    return {
        "lines": lines,
        "unparsed": unparsed,
        "statuses": dict(sorted(statuses.items())),
        "top_paths": _top(paths),
        "top_clients": _top(clients),
    }


def _top(counter: Counter[str]) -> list[list]:
    ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    return [[name, n] for name, n in ranked[:TOP]]
