"""The dashboard in a real browser: Playwright driving Debian's Chromium.

Every page is shot in light and dark, as ``<django-version>-<page>-<scheme>.png``, into
the directory ``REDISQUEUE_SCREENSHOTS`` names (else a pytest temporary directory); on
every page the breadcrumbs must be the markup the running Django's admin styles, and
styled so; the totals of the overview must sit under their columns.
"""

import os
import re
from pathlib import Path

import django
import pytest

from django_redisqueue import broadcast, group
from django_redisqueue.compat import TaskResultStatus
from tests.conftest import account, clock_at, run_worker_here
from tests.support import tasks

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
BASE = "/admin/django_redisqueue/dashboard/default/"
SCHEDULES = "/admin/django_redisqueue/dashboard/periodic/schedules/"
DJANGO = f"{django.VERSION[0]}.{django.VERSION[1]}"
# The breadcrumbs as the admin's CSS of this version styles them (Django 6.1 made
# them a list).
BREADCRUMBS = "nav ol.breadcrumbs" if django.VERSION >= (6, 1) else "nav div.breadcrumbs"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="needs Debian's chromium: apt-get install chromium"
    ),
]


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API runs an event loop in this thread; the test's own database
    # calls are still synchronous, so tell Django they are safe.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                ],
            )
            yield browser
            browser.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("REDISQUEUE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def manager():
    """The account the browser logs in with (the password form, not a test client)."""
    return account("manager", "view_dashboard", "manage_queues", is_staff=True)


def log_in(browser, live_server, scheme):
    page = browser.new_page(color_scheme=scheme, viewport={"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next={BASE}")
    page.fill("#id_username", "manager")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#drq-queues")
    return page


def check_breadcrumbs(page, url):
    """The breadcrumbs are the element this Django's admin CSS styles, coloured as the
    admin's own are (not the page's background), and lead back home."""
    assert page.locator(BREADCRUMBS).count() == 1, url
    colours = page.evaluate(
        """(selector) => {
            const probe = document.createElement("div");
            probe.style.background = "var(--breadcrumbs-bg)";
            document.body.append(probe);
            const admin = getComputedStyle(probe).backgroundColor;
            probe.remove();
            return [getComputedStyle(document.querySelector(selector)).backgroundColor, admin];
        }""",
        BREADCRUMBS,
    )
    assert colours[0] == colours[1] != "rgba(0, 0, 0, 0)", (url, colours)
    links = page.locator(f"{BREADCRUMBS} a").all_inner_texts()
    assert links[:2] == ["Home", "Redis queue"], (url, links)


def check_totals_line_up(page):
    """Each cell of the overview's totals row starts where its column's header does,
    and its number where the numbers above it start, at their size."""
    cells = page.evaluate(
        """() => {
            const table = document.getElementById("drq-queues");
            const text = (cell) => {
                const range = document.createRange();
                range.selectNodeContents(cell);
                return range.getBoundingClientRect().left;
            };
            const row = (r) => Array.from(r.cells).map((cell) => ({
                left: cell.getBoundingClientRect().left,
                text: text(cell),
                size: getComputedStyle(cell).fontSize,
            }));
            return {
                head: row(table.tHead.rows[0]),
                body: row(table.tBodies[0].rows[0]),
                foot: row(table.tFoot.rows[0]),
            };
        }"""
    )
    head, body, foot = cells["head"], cells["body"], cells["foot"]
    assert [c["left"] for c in foot] == [c["left"] for c in head]
    for above, total in list(zip(body, foot, strict=True))[:6]:  # the queue and its numbers
        assert total["text"] == pytest.approx(above["text"], abs=0.5), (above, total)
        assert total["size"] == above["size"]


def shoot(page, shots, name, scheme):
    page.screenshot(path=shots / f"{DJANGO}-{name}-{scheme}.png", full_page=True)


def test_every_page_in_light_and_dark(browser, live_server, backend, manager, shots):
    from tests.test_admin_periodic import SCHEDULES as PERIODIC
    from tests.test_periodic import periodic, stepper

    failed = tasks.fail.enqueue("<script>alert('x')</script>")
    tasks.fail.enqueue("again")
    tasks.add.enqueue("one", 1)  # a TypeError
    finished = group([tasks.add.job(1, 1), tasks.fail.job("no")], callback=tasks.collect.job("x"))
    finished = finished.enqueue()
    backend.broker.heartbeat("web-1:42:beef", {"queues": "default"}, {})
    broadcast(tasks.record.job("reload"))
    backend.broker.receive("web-1:42:beef", ["default"])
    run_worker_here(backend)
    tasks.add.using(delay=3600).enqueue(2, 3)
    for i in range(3):
        tasks.add.using(queue_name="high").enqueue(i, i)
    pages = [
        ("overview", BASE),
        ("queue", BASE + "queue/high/"),
        ("delayed", BASE + "delayed/default/"),
        ("running", BASE + "running/"),
        ("failed", BASE + "failed/default/?task=tests.support.tasks.fail"),
        ("job", BASE + f"job/{failed.id}/"),
        ("groups", BASE + "groups/"),
        ("group", BASE + f"group/{finished.id}/"),
        ("broadcasts", BASE + "broadcasts/"),
        ("schedules", SCHEDULES),
    ]

    with periodic(PERIODIC, "Europe/Berlin") as periodic_backend:
        stepper(periodic_backend)
        for scheme in ("light", "dark"):
            page = log_in(browser, live_server, scheme)
            for name, path in pages:
                page.goto(live_server.url + path)
                check_breadcrumbs(page, path)
                if name == "overview":
                    check_totals_line_up(page)
                shoot(page, shots, name, scheme)
            # The confirmation of an action on selected jobs.
            page.goto(live_server.url + BASE + "failed/default/?task=tests.support.tasks.fail")
            page.check(".drq-select-all")
            page.select_option("#drq-selection select", "delete_failed")
            page.click("#drq-selection input[type=submit]")
            page.wait_for_selector("#drq-selected")
            check_breadcrumbs(page, "confirm")
            shoot(page, shots, "confirm", scheme)
            page.close()


def test_a_manager_filters_selects_and_acts_on_jobs(browser, live_server, backend, manager, r):
    values = [tasks.fail.enqueue(f"<b>{i}</b>") for i in range(3)]
    typed = tasks.add.enqueue("one", 1)  # a TypeError
    run_worker_here(backend)
    delayed = tasks.add.using(delay=3600).enqueue(2, 3)

    page = log_in(browser, live_server, "light")
    page.goto(live_server.url + BASE + "failed/default/")
    # What a job raised shows as text, not markup.
    assert page.locator("#drq-jobs .drq-error b").count() == 0
    assert re.search(r"ValueError: <b>\d</b>", page.locator("#drq-jobs").inner_text())
    page.select_option("select[name=exception]", "builtins.TypeError")
    page.click(".drq-filters input[type=submit]")
    page.wait_for_url(re.compile(r"exception=builtins.TypeError"))
    listed = page.locator("#drq-jobs tbody").inner_text()
    assert typed.id[:10] in listed and values[0].id[:10] not in listed
    assert "Retry all" not in page.locator("#content-main").inner_text()  # not the whole queue

    # Select all on the page, retry them: the filter's jobs only.
    page.goto(live_server.url + BASE + "failed/default/?task=tests.support.tasks.fail")
    page.check(".drq-select-all")
    assert page.locator(".drq-counter").inner_text() == "3 of 3 selected"
    kept = values[0]
    row = page.locator("#drq-jobs tbody tr", has_text=kept.id[:10])
    row.locator(".drq-select input").uncheck()
    assert page.locator(".drq-counter").inner_text() == "2 of 3 selected"
    assert page.evaluate("document.querySelector('.drq-select-all').indeterminate")
    page.select_option("#drq-selection select", "retry_failed")
    page.click("#drq-selection input[type=submit]")
    page.wait_for_selector(".messagelist")
    assert (
        "2 of 2 selected job(s) of queue default put back"
        in page.locator(".messagelist").inner_text()
    )
    statuses = [backend.get_result(job.id).status for job in values]
    assert statuses == [TaskResultStatus.FAILED, TaskResultStatus.READY, TaskResultStatus.READY]
    assert "task=tests.support.tasks.fail" in page.url  # back to the filtered list

    # Deleting asks first, listing the jobs.
    page.check(".drq-select-all")
    page.select_option("#drq-selection select", "delete_failed")
    page.click("#drq-selection input[type=submit]")
    assert kept.id in page.locator("#drq-selected").inner_text()
    page.click('input[value="Yes, I\'m sure"]')
    page.wait_for_selector(".messagelist")
    assert (
        "1 of 1 selected job(s) of queue default deleted"
        in page.locator(".messagelist").inner_text()
    )
    assert backend.queries.jobs([kept.id], "status") == [{}]

    # One job's own button still works; the numbers refresh without a reload.
    due_ms = int(r.zscore(backend.keys.delayed("default"), delayed.id))
    with clock_at(due_ms - 3_599_000):  # 59 minutes 59 seconds before it is due
        page.goto(live_server.url + BASE + "delayed/default/")
        due = page.locator("#drq-jobs time").inner_text()
    assert due == "in 59\xa0minutes"
    page.locator("#drq-jobs tbody tr", has_text=delayed.id[:10]).locator(
        "input[value='Run now']"
    ).click()
    page.wait_for_selector(".messagelist")
    assert "queued to run now" in page.locator(".messagelist").inner_text()
    page.goto(live_server.url + BASE)
    before = page.locator('tr[data-queue="low"] td.drq-ready').inner_text()
    tasks.add.using(queue_name="low").enqueue(1, 1)
    page.wait_for_function(
        "document.querySelector('tr[data-queue=\"low\"] td.drq-ready').innerText === '1'",
        timeout=15_000,
    )
    assert before == "0"
    page.close()


def test_a_manager_cancels_a_group_and_runs_a_schedule_now(browser, live_server, manager):
    from tests.test_admin_periodic import SCHEDULES as PERIODIC
    from tests.test_periodic import periodic, stepper

    waiting = group([tasks.add.job(i, i) for i in range(3)], callback=tasks.collect.job("y"))
    result = waiting.enqueue()
    page = log_in(browser, live_server, "light")
    page.goto(live_server.url + BASE + f"group/{result.id}/")
    page.click("text=Cancel the group")
    page.click('input[value="Yes, I\'m sure"]')
    page.wait_for_selector(".messagelist")
    assert "4 job(s) that had not started" in page.locator(".messagelist").inner_text()

    with periodic(PERIODIC, "Europe/Berlin") as backend:
        stepper(backend)
        page.goto(live_server.url + SCHEDULES)
        row = page.locator("#drq-schedules tr", has_text="nightly")
        assert re.search(r"At 03:00\s", row.inner_text())
        row.locator("text=Pause").click()
        page.wait_for_selector(".messagelist")
        assert "paused" in page.locator("#drq-schedules tr", has_text="nightly").inner_text()
        page.locator("#drq-schedules tr", has_text="nightly").locator("text=Run now").click()
        # The page before had a message too (Pause's): wait for this action's.
        page.wait_for_selector(".messagelist >> text=queued to run now")
        assert backend.queries.queue_length("default") == 1
    page.close()
