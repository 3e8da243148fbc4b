"""The typed HTTP client: the Python SDK, and what the CLI and tests use to talk to the head."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import date
from typing import Any
from urllib.parse import quote

from gpucluster.admin_client import AdminCalls
from gpucluster.clientbase import DEFAULT_URL, ApiError, ClusterUnreachable, resolve_token, resolve_url
from gpucluster.connection import Answer, Connections, Head
from gpucluster.durations import begin_time
from gpucluster.launch.env import exported_env
from gpucluster.models import (
    BudgetList,
    BudgetOut,
    GpuSampleList,
    GpuSampleOut,
    HoldOut,
    Job,
    JobList,
    JobSpec,
    NodeList,
    NodeOut,
    PolicyOut,
    QueueOut,
    UsageOut,
)

__all__ = ["DEFAULT_URL", "ApiError", "Client", "ClusterUnreachable", "resolve_token", "resolve_url"]


class Client(AdminCalls):
    """`Client(url).submit(["python", "train.py"], gpus=2)`.

    url: else $GPUCLUSTER_URL, else the config file's `url`, else http://127.0.0.1:8642.
    token: else $GPUCLUSTER_TOKEN, else the config file's token for that head (see
    `gpucluster.userconfig`; the first `gpucluster up` writes its admin token there).
    """

    def __init__(
        self, url: str | None = None, timeout: float = 30.0, token: str | None = None, verify: bool | str = True
    ) -> None:
        # HTTP/1.1 on standard-library sockets (gpucluster/connection.py): a third of httpx's
        # CPU per call, which bounded a script submitting a sweep (issue 18). Keep-alive
        # connections, one per thread using this client at once; no redirects are followed.
        first = Head(url, timeout, token=token, verify=verify, agent="gpucluster-sdk")
        self.url, self.config_path, self.has_token = first.url, first.config_path, first.has_token
        self._connections = Connections(first)

    def close(self) -> None:
        self._connections.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _request(self, method: str, path: str, params: dict[str, Any] | None = None, json: Any = None) -> Answer:
        """The head's answer; a 4xx/5xx raises ApiError with its message, no answer
        ClusterUnreachable (both worded as the CLI words them: clientbase)."""
        return Answer(self._connections.request(method, path, params, json))

    def submit(
        self, command: list[str] | JobSpec | None = None, *, export: str | Sequence[str] = "ALL", **fields: Any
    ) -> Job:
        """Submit a job: a JobSpec, or a command list plus JobSpec fields (gpus=2, team=...);
        `begin` may be a Unix time, a datetime or what `--begin` reads ("22:00", "now+2h").

        `export` is sbatch's --export: the job runs with this process's environment ("ALL", the
        default, less what the cluster or the node sets: launch/env.py), only the variables named,
        or none of it ("NONE"); `env` still wins over it. A spec's own `exported_env` is kept.
        """
        if isinstance(command, JobSpec):
            body = command.model_dump(exclude_none=True)
            if "team" not in command.model_fields_set:
                body.pop("team", None)  # the head picks the caller's default team
        else:
            body = {"command": command, **fields} if command is not None else dict(fields)
        if isinstance(body.get("begin"), str | date):  # "22:00", "now+2h", a datetime: resolved here
            body["begin"] = begin_time(body["begin"], time.time())
        if body.get("exported_env") is None:
            body.pop("exported_env", None)
            exported = exported_env(os.environ, export)
            if exported is not None:
                body["exported_env"] = exported
        return Job.model_validate(self._request("POST", "/v1/jobs", json=body).json())

    # ---- services (issue 23) ----------------------------------------------------------------

    def create_service(
        self, name: str, command: list[str], *, export: str | Sequence[str] = "ALL", **fields: Any
    ) -> Any:
        """Create a service: `replicas` of `command` (each told its port in $PORT), reached through
        the head at /serve/NAME/; fields as services.spec.ServiceSpec (gpus, readiness,
        min_replicas, max_replicas, target_concurrency, public, ...)."""
        from gpucluster.services.spec import ServiceOut

        body: dict[str, Any] = {"name": name, "command": command, **fields}
        if body.get("exported_env") is None:
            body.pop("exported_env", None)
            exported = exported_env(os.environ, export)
            if exported is not None:
                body["exported_env"] = exported
        body.setdefault("workdir", os.getcwd())
        return ServiceOut.model_validate(self._request("POST", "/v1/services", json=body).json())

    def services(self) -> list[Any]:
        from gpucluster.services.spec import ServiceList

        return ServiceList.model_validate(self._request("GET", "/v1/services").json()).services

    def service(self, name: str) -> Any:
        from gpucluster.services.spec import ServiceOut

        return ServiceOut.model_validate(self._request("GET", f"/v1/services/{quote(name, safe='')}").json())

    def update_service(self, name: str, **changes: Any) -> Any:
        """A rolling update (command, image, env) or new bounds (min_replicas, max_replicas, public)."""
        from gpucluster.services.spec import ServiceOut

        path = f"/v1/services/{quote(name, safe='')}/update"
        return ServiceOut.model_validate(self._request("POST", path, json=changes).json())

    def delete_service(self, name: str) -> Any:
        from gpucluster.services.spec import ServiceOut

        return ServiceOut.model_validate(self._request("DELETE", f"/v1/services/{quote(name, safe='')}").json())

    def job(self, job_id: int) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def jobs(
        self,
        state: list[str] | None = None,
        team: str | None = None,
        limit: int | None = None,
        *,
        offset: int = 0,
        text: str | None = None,
        collapse: bool = False,
    ) -> list[Job]:
        """Jobs, oldest first; `limit` the newest N after skipping the newest `offset`; `text`
        those whose name or owner contains it, or whose id it is; `collapse` an array as one
        entry with `array_counts`."""
        params: dict[str, Any] = {"collapse": "true"} if collapse else {}
        if state:
            params["state"] = state
        if team:
            params["team"] = team
        if limit:
            params["limit"] = limit
        if offset:
            params["offset"] = offset
        if text:
            params["q"] = text
        return JobList.model_validate(self._request("GET", "/v1/jobs", params=params).json()).jobs

    def cancel(self, job_id: int, index: int | None = None, state: Iterable[str] = ()) -> Job:
        """Cancel a job; an array's id cancels every element, `index` only that one (ID[7]);
        `state`: only those in these states (queued, held, running, preempted)."""
        params = _element_params(index, state)
        return Job.model_validate(self._request("POST", f"/v1/jobs/{job_id}/cancel", params=params).json())

    def hold(self, job_id: int, index: int | None = None, state: Iterable[str] = ()) -> list[int]:
        """Hold a queued job (or an array's queued elements, or element `index`; `state` as
        `cancel`); the ids held."""
        params = _element_params(index, state)
        return HoldOut.model_validate(self._request("POST", f"/v1/jobs/{job_id}/hold", params=params).json()).changed

    def release(self, job_id: int, index: int | None = None, state: Iterable[str] = ()) -> list[int]:
        """Release held jobs, as `hold`; the ids released."""
        params = _element_params(index, state)
        return HoldOut.model_validate(self._request("POST", f"/v1/jobs/{job_id}/release", params=params).json()).changed

    def set_throttle(self, array_id: int, throttle: int | None) -> Job:
        """Change how many of an array's elements may run at once (None: no limit)."""
        return Job.model_validate(
            self._request("POST", f"/v1/jobs/{array_id}/array", json={"throttle": throttle}).json()
        )

    def update(self, job_id: int, index: int | None = None, **fields: Any) -> Job:
        """Change a queued job (an array: its queued elements, or element `index`) or a running
        job's time limit: `update(41, priority="high", time_limit="2h")`; a field given as None
        goes back to the submit default. Refused as a submit would be (422, 403), 409 if the
        job is no longer queued."""
        params = {"index": index} if index is not None else None
        return Job.model_validate(self._request("PATCH", f"/v1/jobs/{job_id}", params=params, json=fields).json())

    def requeue(self, job_id: int, index: int | None = None, state: Iterable[str] = ()) -> Job:
        """Checkpoint and requeue a running job (SIGTERM, grace, back in the queue, new attempt);
        an array's id: its running elements (`index`, `state` as `cancel`)."""
        params = _element_params(index, state)
        return Job.model_validate(self._request("POST", f"/v1/jobs/{job_id}/requeue", params=params).json())

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

    def logs(
        self,
        job_id: int,
        offset: int = 0,
        attempt: int | None = None,
        rank: int | None = None,
        all_ranks: bool = False,
    ) -> str:
        """A job's output; for a distributed job, rank 0's unless `rank` is given, or every
        rank's with `all_ranks` (each line prefixed `[rank N] `)."""
        params: dict[str, Any] = {"all_ranks": True} if all_ranks else {"offset": offset}
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
        yield from self._connections.stream(f"/v1/jobs/{job_id}/logs", params)

    def queue(self, limit: int | None = None, job_id: int | None = None) -> QueueOut:
        """The front of the queue (the head's default page when `limit` is None) and its length;
        with `job_id`, that job alone at its position (no entry when it is not queued)."""
        params = {k: v for k, v in (("limit", limit), ("job", job_id)) if v is not None}
        return QueueOut.model_validate(self._request("GET", "/v1/queue", params=params).json())

    def policy(self) -> PolicyOut:
        return PolicyOut.model_validate(self._request("GET", "/v1/policy").json())

    def nodes(self) -> list[NodeOut]:
        return NodeList.model_validate(self._request("GET", "/v1/nodes").json()).nodes

    def drain(self, node: str, reason: str | None = None) -> NodeOut:
        """No new jobs on `node`; its running jobs go on (cluster admins)."""
        body = {"reason": reason} if reason else None
        r = self._request("POST", f"/v1/nodes/{quote(node, safe='')}/drain", json=body)
        return NodeOut.model_validate(r.json())

    def undrain(self, node: str) -> NodeOut:
        """Back to scheduling, forgetting the node's health problems (cluster admins)."""
        return NodeOut.model_validate(self._request("POST", f"/v1/nodes/{quote(node, safe='')}/undrain").json())

    def gpu_samples(self, **query: Any) -> list[GpuSampleOut]:
        """Stored GPU samples: node=, gpu=, job=, since=, until=, level=, limit= (see the API)."""
        params = {k: v for k, v in query.items() if v is not None}
        return GpuSampleList.model_validate(self._request("GET", "/v1/telemetry/samples", params=params).json()).samples

    def usage(self, by: str = "team", since: str = "30d", until: str | None = None) -> UsageOut:
        """GPU-hours, cost, energy, utilisation and lost work of your teams, grouped `by` team, user,
        job or gpu-model, since a duration ago (30d), a date (2025-01-31) or all."""
        params = {"by": by, "since": since, **({"until": until} if until is not None else {})}
        return UsageOut.model_validate(self._request("GET", "/v1/usage", params=params).json())

    def budgets(self) -> list[BudgetOut]:
        """Your teams' budgets in their current periods."""
        return BudgetList.model_validate(self._request("GET", "/v1/budgets").json()).budgets

    def metrics(self) -> str:
        """The Prometheus text of /metrics."""
        return self._request("GET", "/metrics").text

    def health(self) -> dict[str, Any]:
        return dict(self._request("GET", "/v1/health").json())


def _element_params(index: int | None, state: Iterable[str]) -> dict[str, Any] | None:
    """The query of an action on an array: one element (`index`), a state filter (repeated `state`)."""
    params: dict[str, Any] = {}
    if index is not None:
        params["index"] = index
    states = list(state)
    if states:
        params["state"] = states
    return params or None
