"""A fair queue's page in the dashboard: its fairness keys with their backlogs, the
largest first, read from at most FAIR_TURNS_READ of its turns and FAIR_KEYS_SHOWN of
them shown; another queue's page shows none and reads none. Whatever Redis holds
there (a key of another type, members that are no turns), the page answers."""

from __future__ import annotations

import re
from contextlib import contextmanager
from html import escape, unescape

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.compat import task_backends
from django_redisqueue.dashboard.reads import FAIR_KEYS_SHOWN, FAIR_TURNS_READ
from tests.support import tasks
from tests.support.fuzzing import MARK, OTHER_TYPES, encode, fuzz, garbage, make_other_type
from tests.support.topology import keys_server

pytestmark = pytest.mark.django_db

FAIR = "/admin/django_redisqueue/dashboard/fair/"
IMPORTS = FAIR + "queue/imports/"
KEYS = task_backends["fair"].keys
ROW = re.compile(r'<tr><th scope="row" class="drq-args" title="([^"]*)">(.*?)</th><td>(\d+)</td>')


def enqueue(key: str | None, count: int, priority: int = 0, queue: str = "imports") -> None:
    """``count`` jobs of ``key``'s turn at ``priority``, in one call."""
    task = tasks.record.using(backend="fair", queue_name=queue, fair_key=key, priority=priority)
    task.enqueue_many([((f"{key}-{n}",), {}) for n in range(count)])


def section(text: str) -> str:
    """The page's fairness keys section (it fails if there is none)."""
    found = re.search(r'<div class="module" id="drq-fair-keys">.*?</div>', text, re.S)
    assert found, "no fairness keys section"
    return found[0]


def rows(text: str) -> list[tuple[str, str, int]]:
    """The keys shown: (the whole key, as the row's title has it; what the cell shows;
    the jobs waiting), top first."""
    return [
        (unescape(title), unescape(re.sub(r"<[^>]*>", "", shown)), int(n))
        for title, shown, n in ROW.findall(section(text))
    ]


def caption(text: str) -> str:
    return re.search(r"<caption>(.*?)</caption>", section(text), re.S)[1]


def test_the_keys_show_largest_backlog_first_summed_over_their_priorities(viewer):
    enqueue("small", 1)
    enqueue("acme", 2)
    enqueue("acme", 3, priority=10)
    enqueue(None, 2)  # no key: the queue's jobs enqueued without one share a turn
    enqueue(None, 9, queue="default")  # a queue that is not fair: no turns

    for url in (IMPORTS, IMPORTS + "?partial=1"):  # the page, and its part that refreshes
        text = viewer.get(url).text
        assert rows(text) == [("acme", "acme", 5), ("", "(no key)", 2), ("small", "small", 1)]
        # Three keys, in four turns (acme has two priorities): keys are counted.
        assert caption(text) == "Fairness keys: 3 with jobs waiting, the largest backlogs first"
        assert "one key at a time, in turn" in text  # the jobs' list says they go by turns
        assert "And " not in section(text)


def test_at_most_twenty_keys_are_shown_and_the_others_counted(viewer):
    for n in range(FAIR_KEYS_SHOWN + 5):
        enqueue(f"customer-{n:02d}", n + 1)
    enqueue("tied", FAIR_KEYS_SHOWN + 5)  # as many as the largest: after it, by name

    text = viewer.get(IMPORTS).text
    shown = rows(text)
    assert len(shown) == FAIR_KEYS_SHOWN == 20
    expected = [("customer-24", 25), ("tied", 25)]
    expected += [(f"customer-{n:02d}", n + 1) for n in range(23, 5, -1)]
    assert [(key, count) for key, _, count in shown] == expected
    assert caption(text).startswith("Fairness keys: 26 with jobs waiting")
    assert "And 6 more keys, with smaller backlogs." in section(text)


def test_past_the_turns_read_the_keys_are_those_of_the_first_turns(viewer):
    enqueue("first", 3)  # its turn joined first: it goes first
    for n in range(FAIR_TURNS_READ):
        enqueue(f"k{n:04d}", 1)

    text = viewer.get(IMPORTS).text
    turns = FAIR_TURNS_READ + 1
    assert caption(text) == (
        f"Fairness keys: {turns} turns with jobs waiting (one per key and priority); "
        f"the {FAIR_TURNS_READ} keys of the first {FAIR_TURNS_READ}, the largest backlogs first"
    )
    shown = rows(text)
    assert shown[0] == ("first", "first", 3)
    assert [key for key, _, _ in shown[1:]] == [f"k{n:04d}" for n in range(19)]
    assert f"And {FAIR_TURNS_READ - FAIR_KEYS_SHOWN} more keys" in section(text)


def test_keys_are_escaped_and_long_ones_cut_short(viewer):
    hostile, long, colons = MARK + "&'\"", "\u00e9" * 200, "acme:eu:1"
    enqueue(hostile, 3)
    enqueue(long, 2)
    enqueue(colons, 1)

    text = viewer.get(IMPORTS).text
    assert MARK not in text
    assert escape(MARK) in section(text)
    assert rows(text) == [
        (hostile, hostile, 3),
        (long, "\u00e9" * 59 + "\u2026", 2),  # the whole key in its title
        (colons, colons, 1),
    ]


@contextmanager
def commands_logged(r):
    """The commands Redis runs inside the block (its slow log, logging them all), as a
    list filled at its end."""
    server = keys_server(r, KEYS.prefix)
    before = server.config_get("slowlog-*")
    server.config_set("slowlog-log-slower-than", 0)
    server.config_set("slowlog-max-len", 10_000)
    server.slowlog_reset()
    logged: list[str] = []
    try:
        yield logged
        for entry in server.slowlog_get(10_000):
            command = entry["command"]
            logged.append(command.decode() if isinstance(command, bytes) else command)
    finally:
        for name, value in before.items():
            server.config_set(name, value)


def test_another_queue_shows_no_keys_and_costs_no_command_more(viewer, r):
    enqueue("acme", 2)
    enqueue("acme", 1, priority=5)
    enqueue("globex", 1)
    enqueue(None, 1, queue="default")
    viewer.get(FAIR + "queue/default/")  # connections made

    with commands_logged(r) as on_default:
        text = viewer.get(FAIR + "queue/default/").text
    assert "drq-fair-keys" not in text and "Fairness keys" not in text
    assert "in the order they will run" in text
    assert on_default and not [c for c in on_default if KEYS.fair("") in c]

    # The fair queue's page: two round trips, one ZCARD of its entries per turn read.
    with commands_logged(r) as on_imports:
        viewer.get(IMPORTS)
    fair = sorted(c.split()[0].upper() for c in on_imports if KEYS.fair("imports") in c)
    assert fair == ["ZCARD", "ZCARD", "ZCARD", "ZCARD", "ZRANGE"]


def test_a_spoilt_key_or_members_that_are_no_turns_never_break_the_page(viewer, raw):
    turns = KEYS.fair("imports").encode()
    raw.set(turns, b"spoilt by hand")
    text = viewer.get(IMPORTS).text
    assert rows(text) == []
    assert "Fairness keys: 0 with jobs waiting" in text and "No key has jobs waiting." in text

    raw.delete(turns)
    enqueue("good", 3)
    not_utf8 = b"5:\xff\xfe" + MARK.encode()
    raw.zadd(turns, {b"no colon": 0, b"x:no priority": 1, b"101:too high": 2, not_utf8: 3})
    raw.zadd(turns, {b"0:a string": float("-inf"), b"0:empty": float("inf")})
    raw.zadd(turns + b":" + not_utf8, {b"garbage": 1, b"1 2 3": 2})
    raw.set(turns + b":0:a string", b"not a sorted set")
    for url in (IMPORTS, IMPORTS + "?partial=1"):
        response = viewer.get(url)
        assert response.status_code == 200
        text = response.content.decode()
        assert MARK not in text
        spoilt = "\ufffd\ufffd" + MARK  # the bytes that are no UTF-8 replaced
        assert rows(text) == [("good", "good", 3), (spoilt, spoilt, 2)]


hostile_turns = st.lists(
    st.tuples(
        st.one_of(
            st.tuples(st.sampled_from(["0", "-100", "100", "7", "x", "", "1e3"]), garbage).map(
                lambda turn: encode(turn[0]) + b":" + encode(turn[1])
            ),
            garbage.map(encode),
            st.just(b"0:" + MARK.encode()),
        ),
        st.floats(allow_nan=False),
        st.one_of(st.integers(0, 3), st.sampled_from(OTHER_TYPES)),
    ),
    max_size=6,
    unique_by=lambda turn: turn[0],
)


@fuzz(30)
@given(turns=hostile_turns, whole=st.sampled_from([*OTHER_TYPES, "hash"]))
def test_whatever_the_turns_hold_the_page_answers_escaped(viewer, raw, turns, whole):
    key = KEYS.fair("imports").encode()
    raw.delete(key, *[key + b":" + member for member, _, _ in turns])
    for member, score, content in turns:
        raw.zadd(key, {member: score})
        if isinstance(content, int):
            if content:
                raw.zadd(key + b":" + member, {b"x%d" % n: n for n in range(content)})
        else:
            make_other_type(raw, key + b":" + member, content, b"garbage")
    if whole != "zset":
        raw.delete(key)
        if whole == "hash":
            raw.hset(key, b"0:a", b"1")
        else:
            make_other_type(raw, key, whole, b"0:a")
    for url in (IMPORTS, IMPORTS + "?partial=1"):
        response = viewer.get(url)
        assert response.status_code == 200, url
        text = response.content.decode()
        assert MARK not in text
        shown = rows(text)
        assert len(shown) <= FAIR_KEYS_SHOWN
        assert [n for _, _, n in shown] == sorted((n for _, _, n in shown), reverse=True)
