"""A pipeline drawn on a job's page in a real Chromium against a real head: the three steps of a
pipeline with their states and arrows, the middle one with its expected start, updating as each
step ends, without a reload."""

from __future__ import annotations

import contextlib
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from gpucluster.client import ApiError
from tests.dashboard.conftest import Dashboard
from tests.dashboard.test_dashboard import console_errors, go, signed_in, text_of, wait

__all__ = ["signed_in"]  # the fixture, used by name


def until_file(path: Path) -> list[str]:
    """A step that runs until the test creates `path`, then succeeds."""
    return ["sh", "-c", f"while [ ! -e '{path}' ]; do sleep 0.2; done"]


def steps(driver: WebDriver) -> dict[str, tuple[str | None, str | None]]:
    """job id -> (state, depth) of each box drawn."""
    out = {}
    for g in driver.find_elements(By.CSS_SELECTOR, "[data-testid=pipeline] [data-job]"):
        out[str(g.get_attribute("data-job"))] = (g.get_attribute("data-state"), g.get_attribute("data-depth"))
    return out


def test_a_three_step_pipeline_is_drawn_with_its_states_and_follows_them(signed_in: Dashboard, tmp_path: Path) -> None:
    driver: WebDriver = signed_in.driver  # type: ignore[assignment]
    c = signed_in.client
    prepare = c.submit(until_file(tmp_path / "prepared"), name="prepare").id
    train = c.submit(until_file(tmp_path / "trained"), name="train", afterok=[prepare], time_limit="1h").id
    evaluate = c.submit(["true"], name="evaluate", afterok=[train]).id
    a, b, e = str(prepare), str(train), str(evaluate)
    try:
        go(driver, f"#/jobs/{train}")
        wait(
            driver,
            "three steps: prepare running, train and evaluate waiting",
            lambda d: steps(d) == {a: ("running", "-1"), b: ("queued", "0"), e: ("queued", "1")},
        )
        edges = {x.get_attribute("data-edge") for x in driver.find_elements(By.CSS_SELECTOR, "[data-edge]")}
        assert edges == {f"{a}-{b}", f"{b}-{e}"}
        assert "afterok" in text_of(driver, f"[data-edge='{a}-{b}']")
        # the middle step's box: its name and when it should start (after prepare's time limit)
        wait(driver, "train's expected start", lambda d: "starts ~" in text_of(d, f"[data-job='{b}']"))
        assert "train" in text_of(driver, f"[data-job='{b}']")
        signed_in.screenshot("pipeline-waiting")
        (tmp_path / "prepared").touch()
        wait(
            driver,
            "prepare succeeded and train running, on screen",
            lambda d: steps(d) == {a: ("succeeded", "-1"), b: ("running", "0"), e: ("queued", "1")},
        )
        (tmp_path / "trained").touch()
        wait(
            driver,
            "every step succeeded, on screen",
            lambda d: {s for s, _ in steps(d).values()} == {"succeeded"} and len(steps(d)) == 3,
        )
        signed_in.screenshot("pipeline-done")
        # the first step's own page draws the same chain, itself at the left
        go(driver, f"#/jobs/{prepare}")
        wait(driver, "the chain from its start", lambda d: steps(d).get(e) == ("succeeded", "2"))
    finally:
        for job in (evaluate, train, prepare):
            with contextlib.suppress(ApiError):
                c.cancel(job)
    assert console_errors(driver) == []
