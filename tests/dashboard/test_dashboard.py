"""The web dashboard in a real headless Chromium against a real head: every page loads without a
console error, a job submitted through the API shows up and moves queued -> running ->
succeeded on screen without a reload, the log follows live, and sign-in works both ways (the
form after a 401, and a token in the URL fragment). Screenshots of each page are written."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from gpucluster.client import ApiError
from gpucluster.models import ProgressIn
from tests.dashboard.conftest import Dashboard
from tests.e2e.servicekit import APP

POLL_MS = 300  # the page's ?poll=: fast, so state changes show within a second


def page_url(dash: Dashboard, fragment: str = "") -> str:
    return f"{dash.head.url}/?poll={POLL_MS}{fragment}"


def go(driver: WebDriver, route: str) -> None:
    """Navigate inside the page (hash change, no reload)."""
    driver.execute_script("window.location.hash = arguments[0];", route)


def wait(driver: WebDriver, what: str, predicate: Callable[[WebDriver], Any], timeout: float = 60) -> Any:
    # Generous: the browser, the head and the rest of the suite share two cores; a wait ends as
    # soon as its event happens, so only a failing test waits this long.
    # The page re-renders every poll: an element found a moment ago may be gone (stale); try again.
    return WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(predicate, message=f"waiting for {what}")


def text_of(driver: WebDriver, css: str) -> str:
    """The element's text; found again if a re-render replaced it between finding and reading."""
    for _ in range(20):
        found = driver.find_elements(By.CSS_SELECTOR, css)
        try:
            return found[0].text if found else ""
        except StaleElementReferenceException:
            continue
    return ""


def click(driver: WebDriver, css: str) -> None:
    """Click the element, finding it again if a re-render replaced it first."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    wait(driver, f"a click on {css}", clicked)


def console_errors(driver: WebDriver) -> list[str]:
    """Errors logged in the page since the last call: script errors, failed loads, console.error."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def accounting_paths(dash: Dashboard) -> list[str]:
    paths = httpx.get(f"{dash.head.url}/openapi.json", timeout=5).json()["paths"]
    return [p for p in paths if re.fullmatch(r"/v1/(usage|budgets?|accounting|costs?)(/[^{}]*)?", p)]


def declare_load(dash: Dashboard, job_id: int, percent: float) -> bool:
    """Have a job report the load its virtual GPUs' synthetic telemetry shows; False where this
    head has no telemetry (the pages then colour GPUs by allocation)."""
    if "gpu_utilization" not in ProgressIn.model_fields:
        return False
    headers = {"Authorization": f"Bearer {dash.token}"} if dash.token else {}
    r = httpx.post(
        f"{dash.head.url}/v1/jobs/{job_id}/progress", json={"gpu_utilization": percent}, headers=headers, timeout=5
    )
    assert r.status_code == 204, r.text
    return True


@pytest.fixture(scope="module")
def signed_in(dash: Dashboard) -> Dashboard:
    """The browser on the dashboard, signed in through the URL fragment."""
    dash.driver.get(page_url(dash, f"#token={dash.token}" if dash.token else ""))  # type: ignore[attr-defined]
    wait(dash.driver, "the overview", lambda d: d.find_elements(By.CSS_SELECTOR, "[data-gpu]"))  # type: ignore[arg-type]
    return dash


def test_assets_are_served_without_a_token(dash: Dashboard) -> None:
    page = httpx.get(f"{dash.head.url}/", timeout=5)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert '<script type="module" src="/ui/app.js">' in page.text
    script = httpx.get(f"{dash.head.url}/ui/app.js", timeout=5)
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert httpx.get(f"{dash.head.url}/ui/nope.js", timeout=5).status_code == 404
    # `gpucluster up` names the dashboard; into a log file, never with a token.
    started = dash.head.log_path.read_text()
    assert f"dashboard: {dash.head.url}/ " in started and "#token=" not in started
    # The page is no API operation: the OpenAPI document does not list it.
    assert "/" not in httpx.get(f"{dash.head.url}/openapi.json", timeout=5).json()["paths"]


def test_token_in_fragment_is_kept_and_stripped(signed_in: Dashboard) -> None:
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    assert "token=" not in driver.current_url
    assert driver.current_url.endswith("#/")
    if signed_in.token:
        assert driver.execute_script("return localStorage.getItem('gpucluster.token')") == signed_in.token
    assert console_errors(driver) == []


def test_every_page_loads_without_console_errors(signed_in: Dashboard) -> None:
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    running = c.submit(
        ["sh", "-c", "echo started; for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 1; done"],
        gpus=2,
        name="trainer",
        team="default",
    )
    blocker = c.submit(["sleep", "30"], gpus=4, name="blocker")
    queued = c.submit(["true"], gpus=4, name="waits", time_limit="1h")
    try:
        wait(driver, "the trainer to run", lambda _: c.job(running.id).state.value == "running")
        util = declare_load(signed_in, running.id, 85)
        pages: list[tuple[str, str, str]] = [
            ("overview", "#/", f"[data-job='{running.id}']"),
            ("queue", "#/queue", f"[data-testid=queue] [data-job-id='{queued.id}']"),
            ("jobs", "#/jobs", f"[data-testid=running] [data-job-id='{running.id}']"),
            ("job", f"#/jobs/{running.id}", "[data-testid=attempts] [data-attempt='1']"),
            ("usage", "#/usage", "[data-testid=teams] [data-team='default']"),
        ]
        console_errors(driver)
        for name, route, ready in pages:
            go(driver, route)
            wait(driver, f"{name} page ({ready})", lambda d, css=ready: d.find_elements(By.CSS_SELECTOR, css))
            if name == "overview" and util:
                # The live utilisation of the trainer's GPUs, from telemetry, in the grid.
                wait(driver, "utilisation in the grid", lambda d: "85%" in text_of(d, f"[data-job='{running.id}']"))
            if name == "job":
                wait(driver, "the log", lambda d: "line 1" in text_of(d, "[data-testid=log]"))
            if name == "usage":
                panel = wait(driver, "the accounting panel", lambda d: text_of(d, "[data-testid=accounting]"))
                # "No accounting data yet" exactly when the head has no accounting endpoint.
                assert ("No accounting data yet" in panel) == (not accounting_paths(signed_in)), panel
                if "/v1/usage/series" in accounting_paths(signed_in):
                    # The trainer's GPU-hours per day, charted once accrued (every 5 s, and at its end).
                    css = "[data-testid=usage-series-gpu_hours] svg path"
                    wait(driver, "usage over time", lambda d, css=css: d.find_elements(By.CSS_SELECTOR, css))
                    assert "default" in text_of(driver, "[data-testid=usage-series-gpu_hours] figcaption")
            time.sleep(2 * POLL_MS / 1000)  # a couple of live refreshes, which must not log errors either
            signed_in.screenshot(name)
            assert console_errors(driver) == [], f"{name} page logged errors"
        go(driver, "#/queue")
        row = wait(driver, "queue row", lambda d: text_of(d, f"[data-testid=queue] [data-job-id='{queued.id}']"))
        assert "waits" in row and "4" in row  # its name and GPUs, with why it waits
    finally:
        for job in (blocker, queued, running):
            with contextlib.suppress(ApiError):  # it may have ended already
                c.cancel(job.id)


def test_submitted_job_moves_through_states_without_reload(signed_in: Dashboard) -> None:
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    wait(driver, "an idle cluster", lambda _: not c.jobs(state=["running", "queued"]))
    go(driver, "#/jobs")
    wait(driver, "jobs page", lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=running]"))
    driver.execute_script("window.__noReload = 'still here';")
    console_errors(driver)

    blocker = c.submit(["sleep", "60"], gpus=8, name="blocker")
    job = c.submit(["sh", "-c", "echo hello from the dashboard test; sleep 2"], gpus=1, name="watched")
    row = f"[data-job-id='{job.id}'] [data-state]"
    seen = [wait(driver, "queued on screen", lambda d: text_of(d, row) == "queued" and "queued")]
    c.cancel(blocker.id)
    seen.append(wait(driver, "running on screen", lambda d: text_of(d, row) == "running" and "running"))
    # Open its page by clicking: the log follows while it runs.
    click(driver, f"a[href='#/jobs/{job.id}']")
    wait(driver, "the log line", lambda d: "hello from the dashboard test" in text_of(d, "[data-testid=log]"))
    seen.append(
        wait(
            driver,
            "succeeded on screen",
            lambda d: text_of(d, "[data-testid=job-title] [data-state]") == "succeeded" and "succeeded",
        )
    )
    assert seen == ["queued", "running", "succeeded"]
    history = text_of(driver, "[data-testid=events]")
    assert "queued" in history and "running" in history and "succeeded" in history
    wait(driver, "the log's end", lambda d: "ended" in text_of(d, "[data-testid=log-state]"))
    signed_in.screenshot("job-succeeded")
    assert driver.execute_script("return window.__noReload") == "still here"
    assert console_errors(driver) == []


def test_sign_in_form_after_401(dash: Dashboard, signed_in: Dashboard) -> None:
    if not dash.token:
        pytest.skip("this head has no authentication")
    driver: WebDriver = dash.driver  # type: ignore[assignment]
    driver.execute_script("localStorage.clear();")
    driver.get(page_url(dash, "#/queue"))
    driver.refresh()  # a new page: the same URL but for the fragment would not load one
    dialog = wait(
        driver,
        "the sign-in form",
        lambda d: [e for e in d.find_elements(By.ID, "signin") if e.is_displayed()],
    )
    assert "token" in dialog[0].text.lower()
    signed_in.screenshot("sign-in")
    # The 401 that opened the form is the only error logged.
    assert all("401" in e for e in console_errors(driver))
    driver.find_element(By.ID, "signin-token").send_keys("gc_not-a-real-token")
    driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    wait(driver, "the refusal", lambda d: "refused" in text_of(d, "#signin-message"))
    # Checked with one request before it is kept: one 401, logged before the refusal was shown
    # (a page that polled with it logged one per panel, some after this point: a flaky test).
    refusals = console_errors(driver)
    assert len(refusals) == 1 and "/v1/whoami" in refusals[0] and "401" in refusals[0], refusals
    assert driver.execute_script("return localStorage.getItem('gpucluster.token')") is None
    field = driver.find_element(By.ID, "signin-token")
    field.send_keys(dash.token)
    driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    wait(driver, "the queue page", lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=queue]"))
    assert not driver.find_element(By.ID, "signin").is_displayed()
    assert driver.execute_script("return localStorage.getItem('gpucluster.token')") == dash.token
    assert console_errors(driver) == []


def test_job_page_charts_reported_metrics_and_shows_all_ranks(signed_in: Dashboard) -> None:
    """Issue 17: the metrics a script reports, charted per attempt; every rank's log at once,
    prefixed [rank N]."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    job = c.submit(["sh", "-c", 'echo "hello from rank $RANK"; sleep 30'], gpus=2, per_gpu=True, name="ranks")
    try:
        wait(driver, "the job to run", lambda _: c.job(job.id).state.value == "running")
        headers = {"Authorization": f"Bearer {signed_in.token}"} if signed_in.token else {}
        for step, loss in ((10, 0.9), (20, 0.5), (30, 0.25)):
            body = {"step": step, "metrics": {"loss": loss}}
            r = httpx.post(f"{signed_in.head.url}/v1/jobs/{job.id}/progress", json=body, headers=headers, timeout=5)
            assert r.status_code == 204, r.text
        go(driver, f"#/jobs/{job.id}")
        css = "[data-testid=metric-chart-loss] svg path"
        wait(driver, "the loss chart", lambda d: d.find_elements(By.CSS_SELECTOR, css))
        assert "0.25 at step 30" in text_of(driver, "[data-metric=loss]")
        console_errors(driver)
        click(driver, "[data-testid=all-ranks]")
        log = "[data-testid=log]"
        wait(
            driver,
            "both ranks' lines",
            lambda d: (
                "[rank 0] hello from rank 0" in text_of(d, log) and "[rank 1] hello from rank 1" in text_of(d, log)
            ),
        )
        signed_in.screenshot("job-metrics-all-ranks")
        assert console_errors(driver) == []
    finally:
        with contextlib.suppress(ApiError):
            c.cancel(job.id)


def test_an_array_is_a_progress_bar_on_the_jobs_page(signed_in: Dashboard) -> None:
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    first = c.submit(["sh", "-c", "sleep 60"], array="0-3%1", name="sweep-bar")
    array_id = first.array_id
    assert array_id is not None
    try:
        go(driver, "#/jobs")
        row = f"[data-testid=arrays] [data-array-id='{array_id}']"
        wait(
            driver,
            "the array's bar",
            lambda d: "1 running, 3 queued" in text_of(d, f"{row} [data-testid=array-counts]"),
        )
        states = [e.get_attribute("data-state") for e in driver.find_elements(By.CSS_SELECTOR, f"{row} .progress span")]
        assert states == ["running", "queued"]
        assert "0 of 4 ended" in text_of(driver, f"{row} [data-testid=array-counts]")
        signed_in.screenshot("array-progress")
    finally:
        c.cancel(array_id)
    assert console_errors(driver) == []


def test_services_page_shows_a_service_and_its_replicas(signed_in: Dashboard) -> None:
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    c.create_service("web", APP, gpus=0.25, readiness="/health", team="default")
    try:
        wait(driver, "a ready replica", lambda _: any(r.phase == "ready" for r in c.service("web").replicas), 60)
        console_errors(driver)
        go(driver, "#/services")
        css = "[data-testid=services] [data-service='web'] [data-testid=ready]"
        wait(driver, "the service ready on the page", lambda d: text_of(d, css) == "1 / 1")
        replica = c.service("web").replicas[0]
        row = wait(driver, "its replica", lambda d: text_of(d, f"[data-testid=replicas] [data-replica='{replica.id}']"))
        assert "ready" in row and str(replica.port) in row
        time.sleep(2 * POLL_MS / 1000)  # a couple of live refreshes, which must not log errors either
        signed_in.screenshot("services")
        assert console_errors(driver) == [], "services page logged errors"
    finally:
        c.delete_service("web")
