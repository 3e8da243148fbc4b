"""The dashboard items of issue 19 ("the first hour of a user"), in the real browser against a
real head: a requeued job's run time is its attempts', each budget on its own scale, GPUs in use
per team drawn from the head's series (full when the page opens), GPU tiles naming the job and
team the viewer may see, the jobs page's filter and paging, start estimates saying what they
assume, and /docs served from the head itself (nothing from another host)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from gpucluster.client import ApiError, Client
from tests.dashboard.conftest import Dashboard
from tests.dashboard.test_dashboard import click, console_errors, go, page_url, signed_in, text_of, wait

__all__ = ["signed_in"]  # the module-scoped fixture, shared with test_dashboard's pages

NODE = "node0"  # tests/e2e/headproc.py names its node so


def fmt_duration(seconds: float) -> str:
    """ui.js's fmtDuration, for the durations these tests make (under an hour)."""
    s = max(0, round(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


@contextlib.contextmanager
def drained(c: Client) -> Iterator[None]:
    """No new job starts while drained: jobs submitted meanwhile wait, and can be cancelled
    without ever starting a process."""
    c.drain(NODE, "dashboard test")
    try:
        yield
    finally:
        c.undrain(NODE)


def reload(driver: WebDriver, url: str) -> None:
    """A new page at `url`: `get` alone only changes the fragment when the rest is the same."""
    driver.get(url)
    driver.refresh()


def cancel_all(c: Client, *ids: int) -> None:
    for job_id in ids:
        with contextlib.suppress(ApiError):  # it may have ended already
            c.cancel(job_id)


def test_budgets_each_on_its_own_scale(signed_in: Dashboard) -> None:
    """A money budget 97% spent and a GPU-hour budget of 5,000 with 50 spent: each bar is its
    share of its own limit, so the first nearly reaches its 100% line (it was a sliver when both
    shared one axis). The panel's own module renders the head's budget answer in the page."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    budgets = [
        {"team": "vision", "period": "month", "period_end": time.time() + 86400, "money_limit": 100,
         "money_spent": 97, "gpu_hours_limit": None, "gpu_hours_spent": 0, "over": False, "held": None,
         "held_jobs": 0, "on_exceed": "hold"},
        {"team": "nlp", "period": "month", "period_end": time.time() + 86400, "money_limit": None,
         "money_spent": 0, "gpu_hours_limit": 5000, "gpu_hours_spent": 50, "over": False, "held": None,
         "held_jobs": 0, "on_exceed": "hold"},
    ]  # fmt: skip
    bars = driver.execute_async_script(
        """
        const [budgets, done] = arguments;
        import("/ui/pages/accounting.js").then(({ accountingPanel }) => {
          const box = document.createElement("div");
          box.id = "budget-test";
          box.replaceChildren(...accountingPanel({ "/v1/budgets": { budgets } }));
          document.body.append(box);
          const chart = box.querySelector("[data-testid=budget-chart]");
          const limits = [...chart.querySelectorAll("line.chart-limit")].map((l) => Number(l.getAttribute("x1")));
          const rects = [...chart.querySelectorAll("rect")].map((r) => Number(r.getAttribute("width")));
          const texts = [...chart.querySelectorAll("text.chart-value")].map((t) => t.textContent);
          box.remove();
          done({ limits, rects, texts });
        }, (e) => done({ error: String(e) }));
        """,
        budgets,
    )
    assert "error" not in bars, bars
    assert len(bars["rects"]) == 2 and len(set(bars["limits"])) == 1, bars  # one 100% line for both
    label_w = 120  # charts.js: the bars start after the labels
    full = bars["limits"][0] - label_w
    money, gpu_hours = bars["rects"]
    assert money == pytest.approx(0.97 * full, rel=0.01), bars
    assert gpu_hours == pytest.approx(0.01 * full, rel=0.05), bars
    assert bars["texts"] == ["97% (97 of 100)", "1% (50 of 5,000 GPU-h)"]
    assert console_errors(driver) == []


def test_requeued_job_ran_for_its_attempts_not_its_wait(signed_in: Dashboard) -> None:
    """A job requeued and cancelled while it waited ran only for its first attempt: the jobs
    page and the job's page say so, not the span from its start to its end."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    job = c.submit(["sleep", "600"], gpus=1, name="requeued")
    try:
        wait(driver, "it to run", lambda _: c.job(job.id).state.value == "running")
        with drained(c):
            c.requeue(job.id)
            wait(driver, "it back in the queue", lambda _: c.job(job.id).state.value == "queued", timeout=60)
            # Let it wait a few seconds (the drained node starts nothing): the time to leave out.
            queued_at = time.time()
            wait(driver, "3 s in the queue", lambda _: time.time() - queued_at >= 3)
            c.cancel(job.id)
        ended = c.job(job.id)
        attempt = ended.attempts[0]
        assert attempt.started_at is not None and attempt.ended_at is not None
        assert ended.ran_s == pytest.approx(attempt.ended_at - attempt.started_at)
        assert ended.started_at is not None and ended.ended_at is not None
        assert ended.ended_at - ended.started_at > ended.ran_s + 2.5  # what the page showed before
        expected = fmt_duration(ended.ran_s)

        go(driver, "#/jobs")
        cell = f"[data-testid=ended] [data-job-id='{job.id}'] [data-testid=ran]"
        wait(driver, "its run time in the ended list", lambda d: text_of(d, cell) == expected)
        go(driver, f"#/jobs/{job.id}")
        wait(driver, "its run time on its page", lambda d: text_of(d, "[data-testid=ran]") == expected)
        signed_in.screenshot("requeued-run-time")
        assert console_errors(driver) == []
    finally:
        cancel_all(c, job.id)


def test_gpus_in_use_per_team_come_from_the_head(signed_in: Dashboard) -> None:
    """The chart is drawn from GET /v1/usage/series the moment the page opens, over the last
    hour, not sampled by the page: a freshly loaded page already shows the team's earlier use."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    job = c.submit(["sleep", "600"], gpus=2, name="user-of-gpus")
    try:
        wait(driver, "it to run", lambda _: c.job(job.id).state.value == "running")
        # Accrued every 5 s: wait until the head's own usage shows the team.
        wait(
            driver,
            "accrued usage",
            lambda _: any(r.key == "default" and r.gpu_hours > 0 for r in c.usage(since="1h").rows),
            timeout=60,
        )
        opened = time.time()
        reload(driver, page_url(signed_in, "#/usage"))  # a new page: nothing sampled before
        figure = "figure[data-testid=running-chart]"
        wait(driver, "the chart", lambda d: d.find_elements(By.CSS_SELECTOR, f"{figure} svg path"))
        since = float(driver.find_element(By.CSS_SELECTOR, figure).get_attribute("data-since") or "nan")
        assert since < opened - 3000  # an hour of the head's data, not the page's few seconds
        assert "default" in text_of(driver, f"{figure} figcaption")
        # The line ends at the team's 2 running GPUs now: the y axis's top label.
        assert text_of(driver, f"{figure} svg text.chart-value") == "2"
        signed_in.screenshot("usage-in-use")
        assert console_errors(driver) == []
    finally:
        cancel_all(c, job.id)


def test_gpu_tiles_name_the_job_and_team_the_viewer_may_see(signed_in: Dashboard) -> None:
    """The admin sees the job's name and team on its GPUs; a member of another team sees only
    its id (GET /v1/jobs shows them no job of another team)."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    made = httpx.post(
        f"{signed_in.head.url}/v1/admin/users",
        json={"name": "outsider", "teams": ["elsewhere"]},
        headers=signed_in.head.headers,
        timeout=10,
    )
    assert made.status_code == 201, made.text
    outsider = made.json()["token"]
    job = c.submit(["sleep", "600"], gpus=1, name="tile-job")
    tile = f"[data-job='{job.id}']"
    try:
        wait(driver, "it to run", lambda _: c.job(job.id).state.value == "running")
        go(driver, "#/")
        wait(driver, "its name on its GPU", lambda d: "tile-job" in text_of(d, f"{tile} [data-testid=gpu-job-name]"))
        assert text_of(driver, f"{tile} [data-testid=gpu-job-team]") == "default"
        signed_in.screenshot("overview-named-tiles")

        driver.execute_script("localStorage.setItem('gpucluster.token', arguments[0]);", outsider)
        reload(driver, page_url(signed_in, "#/"))
        wait(driver, "the tile, as the outsider", lambda d: f"#{job.id}" in text_of(d, tile))
        assert "tile-job" not in text_of(driver, tile) and "default" not in text_of(driver, tile)
        assert not driver.find_elements(By.CSS_SELECTOR, f"{tile} [data-testid=gpu-job-name]")
        assert console_errors(driver) == []
    finally:
        if signed_in.token:
            driver.execute_script("localStorage.setItem('gpucluster.token', arguments[0]);", signed_in.token)
        reload(driver, page_url(signed_in))
        wait(driver, "the overview", lambda d: d.find_elements(By.CSS_SELECTOR, "[data-gpu]"))
        cancel_all(c, job.id)


def test_jobs_page_filters_and_pages(signed_in: Dashboard) -> None:
    """Seven `batch-N` jobs (cancelled while queued, so none starts a process), five a page:
    the text filter finds exactly them, newest first, and the pager reaches the other two; the
    state filter hides the sections it excludes."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    with drained(c):
        ids = [c.submit(["true"], gpus=1, name=f"batch-{n}").id for n in range(1, 8)]
        cancel_all(c, *ids)
    driver.get(f"{page_url(signed_in)}&pagesize=5#/jobs")
    wait(driver, "the jobs page", lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=job-filter]"))
    console_errors(driver)
    driver.find_element(By.CSS_SELECTOR, "[data-testid=job-filter] input[name=q]").send_keys("batch")
    rows = "[data-testid=ended] tbody tr"

    def shown(d: WebDriver) -> list[int]:
        return [int(e.get_attribute("data-job-id") or 0) for e in d.find_elements(By.CSS_SELECTOR, rows)]

    def page_of(d: WebDriver, first: int, last: int) -> bool:
        """The filtered list's page `first`-`last` (the newest jobs are these too unfiltered)."""
        in_range = text_of(d, "[data-testid=page-range]") == f"{first}-{last} of 7"
        return in_range and shown(d) == ids[::-1][first - 1 : last]

    wait(driver, "the first page of batch jobs", lambda d: page_of(d, 1, 5))
    assert "Only jobs matching" in text_of(driver, "[data-testid=filter-note]")
    signed_in.screenshot("jobs-filtered")
    click(driver, "button[data-page=older]")
    wait(driver, "the second page", lambda d: page_of(d, 6, 7))
    click(driver, "button[data-page=newer]")
    wait(driver, "the first page again", lambda d: page_of(d, 1, 5))

    state = Select(driver.find_element(By.CSS_SELECTOR, "[data-testid=job-filter] select[name=state]"))
    state.select_by_value("running")
    wait(driver, "only the running section", lambda d: not d.find_elements(By.CSS_SELECTOR, "[data-testid=ended]"))
    assert driver.find_elements(By.CSS_SELECTOR, "[data-testid=running]")
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid=waiting]")
    state.select_by_value("cancelled")
    wait(driver, "the cancelled batch jobs", lambda d: page_of(d, 1, 5))
    team = Select(driver.find_element(By.CSS_SELECTOR, "[data-testid=job-filter] select[name=team]"))
    assert "default" in [o.get_attribute("value") for o in team.options]
    team.select_by_value("default")
    wait(driver, "the same, by team", lambda d: page_of(d, 1, 5))
    assert console_errors(driver) == []
    driver.get(page_url(signed_in))  # back to the plain page for the next tests
    wait(driver, "the overview", lambda d: d.find_elements(By.CSS_SELECTOR, "[data-gpu]"))


def test_estimates_say_what_they_assume(signed_in: Dashboard) -> None:
    """Next to an estimated start: it assumes running jobs use their whole time limit, the
    policy's default (1h) where none is set, as the CLI says."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    blocker = c.submit(["sleep", "600"], gpus=8, name="holds-all")
    waiting = c.submit(["true"], gpus=8, name="waits-for-all")
    assumption = (
        "assuming jobs run as long as similar finished jobs did, else their whole time limit,"
        " the default 1h where none is set"
    )
    try:
        wait(driver, "its estimate", lambda _: c.job(waiting.id).estimated_start is not None, timeout=60)
        go(driver, "#/queue")
        wait(driver, "the queue's note", lambda d: assumption in text_of(d, "[data-testid=estimate-assumption]"))
        go(driver, f"#/jobs/{waiting.id}")
        wait(driver, "the job's note", lambda d: assumption in text_of(d, "[data-testid=estimate-assumption]"))
        signed_in.screenshot("estimate-assumption")
        assert console_errors(driver) == []
    finally:
        cancel_all(c, waiting.id, blocker.id)


def test_docs_come_from_the_head_itself(signed_in: Dashboard) -> None:
    """/docs works on a cluster without internet access: every file it loads is the head's own,
    and Swagger UI renders the API's document in the browser."""
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    url = signed_in.head.url
    page = httpx.get(f"{url}/docs", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page.text)
    assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
    assert not re.search(r"https?://(?!www\.w3\.org)", page.text), "an absolute URL in /docs"
    for ref in refs:
        assert httpx.get(f"{url}{ref}", timeout=10).status_code == 200, ref
    assert httpx.get(f"{url}/redoc", timeout=10).status_code == 404  # ReDoc would need a CDN
    try:
        console_errors(driver)
        driver.get(f"{url}/docs")
        wait(driver, "Swagger UI's title", lambda d: "gpucluster" in text_of(d, ".swagger-ui .info .title"))
        wait(driver, "the operations", lambda d: "/v1/jobs" in text_of(d, ".swagger-ui .opblock-tag-section"))
        loaded = driver.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
        assert loaded and all(u.startswith(f"{url}/") for u in loaded), loaded
        signed_in.screenshot("docs")
        assert console_errors(driver) == []
    finally:
        driver.get(page_url(signed_in))
        wait(driver, "the overview", lambda d: d.find_elements(By.CSS_SELECTOR, "[data-gpu]"))
