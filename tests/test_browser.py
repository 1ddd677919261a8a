"""The dashboard in a real browser: Playwright driving Debian's Chromium.

Screenshots of every page, light and dark, go to test-artifacts/screenshots/.
"""

import os
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

from django_redisqueue.compat import TaskResultStatus
from tests import tasks
from tests.conftest import ROOT, run_worker_here

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "test-artifacts" / "screenshots"
BASE = "/admin/django_redisqueue/dashboard/default/"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="needs Debian's chromium: apt-get install chromium"
    ),
]


@pytest.fixture
def browser(monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the test's own database
    # calls are still synchronous, so tell Django they are safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
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


def log_in(browser, live_server, scheme):
    page = browser.new_page(color_scheme=scheme, viewport={"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next={BASE}")
    page.fill("#id_username", "manager")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#drq-queues")
    return page


def cell(page, queue, column):
    return page.locator(f'tr[data-queue="{queue}"] td.drq-{column}').inner_text()


def test_a_manager_sees_the_queues_and_acts_on_jobs(browser, live_server, backend):
    manager = User.objects.create_user("manager", password="pw", is_staff=True)
    for codename in ("view_dashboard", "manage_queues"):
        manager.user_permissions.add(Permission.objects.get(codename=codename))
    failed = tasks.fail.enqueue("<script>alert('x')</script>")
    run_worker_here(backend)
    delayed = tasks.add.using(delay=3600).enqueue(2, 3)
    for i in range(3):
        tasks.add.using(queue_name="high").enqueue(i, i)

    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        page = log_in(browser, live_server, scheme)
        counts = backend.broker.counts(backend.queue_names)
        assert cell(page, "high", "ready") == str(counts["high"]["ready"]) == "3"
        assert cell(page, "default", "failed") == "1"
        assert cell(page, "default", "delayed") == "1"
        for name, path in [
            ("overview", BASE),
            ("queue", BASE + "queue/high/"),
            ("delayed", BASE + "delayed/"),
            ("running", BASE + "running/"),
            ("failed", BASE + "failed/default/"),
            ("job", BASE + f"job/{failed.id}/"),
            ("confirm", BASE + "confirm/empty/?queue=high"),
        ]:
            page.goto(live_server.url + path)
            page.screenshot(path=SHOTS / f"{name}-{scheme}.png", full_page=True)
        page.close()

    page = log_in(browser, live_server, "light")
    page.goto(live_server.url + BASE + "failed/default/")
    assert "alert('x')" in page.locator(".drq-error").inner_text()  # shown as text
    page.locator("#drq-jobs tbody tr", has_text=failed.id[:10]).locator(
        "input[value=Retry]"
    ).click()
    page.wait_for_selector(".messagelist")
    assert "put back on their queue" in page.locator(".messagelist").inner_text()
    assert failed.id[:10] not in page.locator("#drq-jobs").inner_text()
    assert backend.get_result(failed.id).status == TaskResultStatus.READY

    page.goto(live_server.url + BASE + "delayed/")
    page.locator("#drq-jobs tbody tr", has_text=delayed.id[:10]).locator(
        "input[value='Run now']"
    ).click()
    page.wait_for_selector(".messagelist")
    assert "queued to run now" in page.locator(".messagelist").inner_text()
    assert re.search(r"0 delayed jobs", page.locator("#drq-jobs caption").text_content())
    assert backend.broker.queue_length("default") == 2  # the retried and the delayed one

    # The numbers refresh without a reload.
    page.goto(live_server.url + BASE)
    before = cell(page, "low", "ready")
    tasks.add.using(queue_name="low").enqueue(1, 1)
    page.wait_for_function(
        "document.querySelector('tr[data-queue=\"low\"] td.drq-ready').innerText === '1'",
        timeout=15_000,
    )
    assert before == "0"
    assert os.listdir(SHOTS)


def test_a_manager_follows_a_group_and_cancels_it(browser, live_server, backend):
    from django_redisqueue import broadcast, group

    manager = User.objects.create_user("manager", password="pw", is_staff=True)
    for codename in ("view_dashboard", "manage_queues"):
        manager.user_permissions.add(Permission.objects.get(codename=codename))
    backend.broker.heartbeat("web-1:42:beef", {}, {})
    broadcast(tasks.record.job("reload"))
    backend.broker.receive("web-1:42:beef", ["default"])
    done = group([tasks.add.job(1, 1), tasks.fail.job("no")], callback=tasks.collect.job("x"))
    finished = done.enqueue()
    run_worker_here(backend)
    waiting = group([tasks.add.job(i, i) for i in range(3)], callback=tasks.collect.job("y"))
    result = waiting.enqueue()

    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        page = log_in(browser, live_server, scheme)
        for name, path in [
            ("groups", BASE + "groups/"),
            ("group", BASE + f"group/{finished.id}/"),
            ("broadcasts", BASE + "broadcasts/"),
        ]:
            page.goto(live_server.url + path)
            page.screenshot(path=SHOTS / f"{name}-{scheme}.png", full_page=True)
        page.close()

    page = log_in(browser, live_server, "light")
    page.goto(live_server.url + BASE + "groups/")
    assert result.id[:10] in page.locator("body").inner_text()
    page.goto(live_server.url + BASE + "broadcasts/")
    assert "web-1:42:beef" in page.locator("body").inner_text()
    page.goto(live_server.url + BASE + f"group/{result.id}/")
    page.click("text=Cancel the group")
    page.click('input[value="Yes, I\'m sure"]')
    page.wait_for_selector(".messagelist")
    assert "4 job(s) that had not started" in page.locator(".messagelist").inner_text()
    assert backend.get_result(result.callback_id).status == TaskResultStatus.FAILED


def test_a_manager_pauses_a_schedule_and_runs_it_now(browser, live_server):
    from tests.test_admin_periodic import SCHEDULES
    from tests.test_periodic import periodic, stepper

    manager = User.objects.create_user("manager", password="pw", is_staff=True)
    for codename in ("view_dashboard", "manage_queues"):
        manager.user_permissions.add(Permission.objects.get(codename=codename))
    schedules = "/admin/django_redisqueue/dashboard/periodic/schedules/"
    with periodic(SCHEDULES, "Europe/Berlin") as backend:
        stepper(backend)
        SHOTS.mkdir(parents=True, exist_ok=True)
        for scheme in ("light", "dark"):
            page = log_in(browser, live_server, scheme)
            page.goto(live_server.url + schedules)
            page.screenshot(path=SHOTS / f"schedules-{scheme}.png", full_page=True)
            page.close()

        page = log_in(browser, live_server, "light")
        page.goto(live_server.url + schedules)
        row = page.locator("#drq-schedules tr", has_text="nightly")
        assert re.search(r"At 03:00\s", row.inner_text())
        row.locator("text=Pause").click()
        page.wait_for_selector(".messagelist")
        assert "paused" in page.locator("#drq-schedules tr", has_text="nightly").inner_text()
        page.locator("#drq-schedules tr", has_text="nightly").locator("text=Run now").click()
        page.wait_for_selector(".messagelist")
        assert backend.broker.queue_length("default") == 1
