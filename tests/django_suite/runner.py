"""Django's ``DiscoverRunner``, with what the harness adds: the not-applicable list
(those tests are skipped with their reason, and a listed test that no longer exists
stops the run), an empty Redis before every test, and counts per module."""

# ruff: noqa: N802 (unittest's method names are camelCase)

from __future__ import annotations

import re
import unittest
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from django.test.runner import DiscoverRunner
from django.test.utils import iter_test_cases

NOT_APPLICABLE = Path(__file__).with_name("not_applicable.txt")

# tasks.test_x.Class.test_y [6.1+]: reason
LINE = re.compile(r"^(?P<id>[\w.]+)(?:\s+\[(?P<since>\d+\.\d+)\+\])?:\s+(?P<reason>\S.*)$")


class ListError(Exception):
    """The not-applicable list is malformed or names a test that does not exist."""


@dataclass(frozen=True)
class Entry:
    test_id: str  # a test, or a class or module: every test in it
    reason: str
    since: tuple[int, ...] = ()  # the first Django version that has the test
    line: int = 0

    def covers(self, test_id: str) -> bool:
        return _under(test_id, self.test_id)


def _under(test_id: str, label: str) -> bool:
    """Whether ``test_id`` is ``label`` or inside it (a module's or class's test)."""
    return test_id == label or test_id.startswith(label + ".")


def read_list(path: Path = NOT_APPLICABLE) -> list[Entry]:
    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        match = LINE.match(text)
        if match is None:
            raise ListError(f"{path.name}:{number}: expected 'TEST_ID [X.Y+]: reason': {raw!r}")
        since = tuple(int(p) for p in match["since"].split(".")) if match["since"] else ()
        entries.append(Entry(match["id"], match["reason"], since, number))
    seen: set[str] = set()
    for entry in entries:
        if entry.test_id in seen:
            raise ListError(f"{path.name}:{entry.line}: {entry.test_id} is listed twice")
        seen.add(entry.test_id)
    return entries


class SuiteResult(unittest.TextTestResult):
    """Empties the private Redis before each test; remembers what failed, and why."""

    redis_url = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client = redis.Redis.from_url(self.redis_url)
        self.outcomes: dict[str, str] = {}  # test id: "passed", "failed" or "n/a"
        self.reasons: dict[str, str] = {}  # failed test id: the first error's last line

    def startTest(self, test: unittest.TestCase) -> None:
        self.client.flushall()
        super().startTest(test)

    def _failed(self, test: Any, err: Any) -> None:
        test_id = test.id()
        self.outcomes[test_id] = "failed"
        if test_id not in self.reasons:
            exc = err[1]
            message = str(exc).strip().splitlines()
            self.reasons[test_id] = f"{type(exc).__name__}: {message[-1] if message else ''}"

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._failed(test, err)

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._failed(test, err)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._failed(test, err)

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "failed"
        self.reasons[test.id()] = "unexpected success"

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "n/a"

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        self.outcomes.setdefault(test.id(), "passed")

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self.outcomes.setdefault(test.id(), "passed")


class SuiteRunner(DiscoverRunner):
    """Runs every test of Django's ``tests/tasks`` package (or those under ``only``),
    skipping the listed ones."""

    def __init__(
        self,
        *,
        redis_url: str,
        django_version: tuple[int, ...],
        only: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.redis_url = redis_url
        self.django_version = django_version
        self.only = only or []
        self.result: SuiteResult | None = None

    def build_suite(self, test_labels: Any = None, **kwargs: Any) -> unittest.TestSuite:
        suite = super().build_suite(["tasks"], **kwargs)
        tests = list(iter_test_cases(suite))
        ids = [test.id() for test in tests]
        entries = [e for e in read_list() if self.django_version >= e.since]
        stale = [e for e in entries if not any(e.covers(test_id) for test_id in ids)]
        if stale:
            raise ListError(
                "not_applicable.txt lists tests that Django's suite no longer has: "
                + ", ".join(f"{e.test_id} (line {e.line})" for e in stale)
                + "; remove them, or mark the version that introduced them ([X.Y+])."
            )
        for test in tests:
            entry = next((e for e in entries if e.covers(test.id())), None)
            if entry is not None:
                method = getattr(test, test._testMethodName)
                skipped = unittest.skip(f"not applicable: {entry.reason}")(method)
                setattr(test, test._testMethodName, skipped)
        if self.only:
            tests = [t for t in tests if any(_under(t.id(), label) for label in self.only)]
            if not tests:
                raise ListError(f"no test of Django's suite matches {' '.join(self.only)}")
        return self.test_suite(tests)

    def get_resultclass(self) -> type[SuiteResult]:
        return type("SuiteResult", (SuiteResult,), {"redis_url": self.redis_url})

    def run_suite(self, suite: unittest.TestSuite, **kwargs: Any) -> SuiteResult:
        result = super().run_suite(suite, **kwargs)
        self.result = result
        return result

    def counts(self) -> dict[str, dict[str, int]]:
        """{module: {"passed": n, "failed": n, "n/a": n}}, and a "total" row."""
        assert self.result is not None
        table: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
        for test_id, outcome in self.result.outcomes.items():
            module = ".".join(test_id.split(".")[:2]) if test_id.startswith("tasks.") else "?"
            table[module][outcome] += 1
            table["total"][outcome] += 1
        return dict(table)


OUTCOMES = ("passed", "failed", "n/a")
