"""One real head and one real headless Chromium (Debian's, driven by selenium through the system
chromedriver), shared by the whole module: starting them is the expensive part.

Screenshots go to test-artifacts/dashboard/ (git-ignored); the run's summary prints where.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster import userconfig
from gpucluster.client import Client
from tests.e2e.headproc import HeadProcess

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
_written: list[Path] = []


def chromium_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


class Dashboard:
    """The head, a client with the head's admin token, and the browser pointed at the head."""

    def __init__(self, head: HeadProcess, token: str | None, driver: object) -> None:
        self.head = head
        self.token = token
        self.driver = driver
        self.client = Client(head.url, token=token)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), f"could not write {path}"  # type: ignore[attr-defined]
        _written.append(path)
        return path


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    paths = chromium_paths()
    if paths is None:
        why = "chromium and chromedriver are not installed (scripts/test.sh installs them with apt)"
        if os.environ.get("CI"):
            pytest.fail(why)  # on CI the browser tests must run, never pass by being skipped
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    base = tmp_path_factory.mktemp("dashboard")
    with pytest.MonkeyPatch.context() as mp:
        # The head writes its first admin token here, and the test's client reads it from here.
        mp.setenv(userconfig.ENV_PATH, str(base / "config.yaml"))
        # Sample GPUs often, so utilisation reaches the page within a second (where telemetry exists).
        fast = ("--telemetry-interval", "0.5s") if importlib.util.find_spec("gpucluster.telemetry.setup") else ()
        head = HeadProcess(base / "data", gpus=8, extra_args=fast)
        service: Service | None = None
        driver = None
        try:
            head.start()
            token = userconfig.load().token_for(head.url)
            options = webdriver.ChromeOptions()
            options.binary_location = paths[0]
            for arg in (
                "--headless=new",
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--disable-gpu",
                "--window-size=1400,1800",
                "--disable-extensions",
                "--no-first-run",
            ):
                options.add_argument(arg)
            options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
            # Its own session: chromedriver and the browser it starts form one process group, killed
            # by its id below even if quitting the browser fails.
            service = Service(
                executable_path=paths[1],
                log_output=str(base / "chromedriver.log"),
                popen_kw={"start_new_session": True},
            )
            driver = webdriver.Chrome(options=options, service=service)
            driver.set_page_load_timeout(20)
            yield Dashboard(head, token, driver)
        finally:
            if driver is not None:
                with contextlib.suppress(Exception):
                    driver.quit()
            process = service.process if service is not None else None
            if process is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
            head.stop()
            head.kill_jobs()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _written:
        terminalreporter.write_line(f"dashboard screenshots ({len(_written)}): {ARTIFACTS}")
