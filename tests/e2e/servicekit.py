"""Helpers for the services' end-to-end tests: a replica command, load generators, waits."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from gpucluster.client import Client

from .headproc import wait_for

APP = [sys.executable, str(Path(__file__).with_name("serviceapp.py"))]


class Load:
    """Requests from `workers` threads, each on its own keep-alive client, until `stop()` (or
    `total` requests in all); every answer's status (or the exception's name) is counted."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        path: str = "",
        workers: int = 4,
        total: int | None = None,
        retry_unreachable: bool = False,
    ) -> None:
        """`retry_unreachable`: a request that finds no head (refused, or cut by the head's death)
        is sent again, as a client of a restarting server does; `retries` counts them."""
        self.retry_unreachable = retry_unreachable
        self.retries = 0
        self.url = url
        self.headers = headers
        self.path = path
        self.total = total
        self.outcomes: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def done(self) -> int:
        with self._lock:
            return sum(self.outcomes.values())

    def _take(self) -> bool:
        with self._lock:
            if self._stop.is_set():
                return False
            if self.total is not None and sum(self.outcomes.values()) + self._sent >= self.total:
                return False
            self._sent += 1
            return True

    _sent = 0

    def _work(self) -> None:
        with httpx.Client(timeout=60, headers=self.headers) as c:
            while self._take():
                while True:
                    try:
                        r = c.get(self.url + self.path)
                        outcome = str(r.status_code)
                        body = r.json() if r.status_code == 200 else {"error": r.text}
                    except httpx.TransportError as e:
                        if self.retry_unreachable and not self._stop.is_set():
                            with self._lock:
                                self.retries += 1
                            self._stop.wait(0.05)  # the head is restarting: poll for it
                            continue
                        outcome, body = type(e).__name__, {}
                    break
                with self._lock:
                    self._sent -= 1
                    self.outcomes[outcome] += 1
                    self.bodies.append(body)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def wait(self) -> None:
        for t in self._threads:
            t.join(timeout=600)


def phases(c: Client, name: str) -> list[str]:
    return [r.phase for r in c.service(name).replicas]


def wait_ready(c: Client, name: str, count: int, timeout: float = 60) -> Any:
    def ready() -> Any:
        s = c.service(name)
        return s if sum(r.phase == "ready" for r in s.replicas) == count else None

    return wait_for(ready, timeout=timeout, what=f"{count} ready replicas of {name}")
