"""The typed HTTP client: the Python SDK, and what the CLI and tests use to talk to the head."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx

from gpucluster.models import Job, JobList, JobSpec, NodeList, NodeOut, PolicyOut, QueueEntry, QueueOut

DEFAULT_URL = "http://127.0.0.1:8642"


class ApiError(RuntimeError):
    """The head refused a request; `message` says what was wrong and how to fix it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClusterUnreachable(RuntimeError):
    pass


def resolve_url(url: str | None = None) -> str:
    return (url or os.environ.get("GPUCLUSTER_URL") or DEFAULT_URL).rstrip("/")


class Client:
    """`Client(url).submit(["python", "train.py"], gpus=2)`; url defaults to $GPUCLUSTER_URL."""

    def __init__(self, url: str | None = None, timeout: float = 30.0) -> None:
        self.url = resolve_url(url)
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise ClusterUnreachable(
                f"cannot reach the head at {self.url} ({e.__class__.__name__}); is `gpucluster up` "
                "running? Point to it with --url or GPUCLUSTER_URL"
            ) from None
        if r.status_code >= 400:
            try:
                message = r.json().get("error") or r.text
            except ValueError:
                message = r.text or r.reason_phrase
            raise ApiError(r.status_code, str(message))
        return r

    def submit(self, command: list[str] | JobSpec | None = None, **fields: Any) -> Job:
        """Submit a job: a JobSpec, or a command list plus JobSpec fields (gpus=2, team=...)."""
        if isinstance(command, JobSpec):
            body = command.model_dump(exclude_none=True)
        else:
            body = {"command": command, **fields} if command is not None else dict(fields)
        return Job.model_validate(self._request("POST", "/v1/jobs", json=body).json())

    def job(self, job_id: int) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def jobs(self, state: list[str] | None = None, team: str | None = None, limit: int | None = None) -> list[Job]:
        params: dict[str, Any] = {}
        if state:
            params["state"] = state
        if team:
            params["team"] = team
        if limit:
            params["limit"] = limit
        return JobList.model_validate(self._request("GET", "/v1/jobs", params=params).json()).jobs

    def cancel(self, job_id: int) -> Job:
        return Job.model_validate(self._request("POST", f"/v1/jobs/{job_id}/cancel").json())

    def requeue(self, job_id: int) -> Job:
        """Checkpoint and requeue a running job (SIGTERM, grace, back in the queue, new attempt)."""
        return Job.model_validate(self._request("POST", f"/v1/jobs/{job_id}/requeue").json())

    def report_progress(
        self,
        job_id: int,
        step: int | None = None,
        checkpoint_at: float | None = None,
        checkpoint_step: int | None = None,
    ) -> None:
        """What gpucluster.train.ProgressReporter sends from a running job."""
        body = {"step": step, "checkpoint_at": checkpoint_at, "checkpoint_step": checkpoint_step}
        self._request("POST", f"/v1/jobs/{job_id}/progress", json=body)

    def logs(self, job_id: int, offset: int = 0, attempt: int | None = None, rank: int | None = None) -> str:
        """A job's output; for a distributed job, rank 0's unless `rank` is given."""
        params: dict[str, Any] = {"offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        if rank is not None:
            params["rank"] = rank
        return self._request("GET", f"/v1/jobs/{job_id}/logs", params=params).text

    def follow_logs(self, job_id: int, attempt: int | None = None, rank: int | None = None) -> Iterator[str]:
        """Yield the log as it grows, until the job's attempt ends."""
        params: dict[str, Any] = {"follow": True}
        if attempt is not None:
            params["attempt"] = attempt
        if rank is not None:
            params["rank"] = rank
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ApiError(r.status_code, str(r.json().get("error", r.text)))
                yield from r.iter_text()
        except httpx.TransportError as e:
            raise ClusterUnreachable(f"lost the head at {self.url} while following logs ({e})") from None

    def queue(self) -> list[QueueEntry]:
        return QueueOut.model_validate(self._request("GET", "/v1/queue").json()).entries

    def policy(self) -> PolicyOut:
        return PolicyOut.model_validate(self._request("GET", "/v1/policy").json())

    def nodes(self) -> list[NodeOut]:
        return NodeList.model_validate(self._request("GET", "/v1/nodes").json()).nodes

    def health(self) -> dict[str, Any]:
        return dict(self._request("GET", "/v1/health").json())
