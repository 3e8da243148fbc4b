"""Who a caller is and what that lets them do with a job.

The rules, in one place (the API enforces them, the authorization matrix test checks them):
- a member sees and follows the logs of their teams' jobs, submits to their teams, and cancels,
  requeues or reports progress for the jobs they submitted themselves;
- a team admin may also cancel and requeue any job of that team;
- a cluster admin may do everything, including managing users and tokens;
- a job's own token may only report that job's progress.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpucluster.errors import GpuclusterError
from gpucluster.store.access import TEAM_ADMIN

CLUSTER_ADMIN = "cluster-admin"


class Unauthorized(PermissionError, GpuclusterError):
    """No credential, or one that is unknown, revoked or expired (HTTP 401)."""


class Denied(PermissionError, GpuclusterError):
    """A known caller asked for something their role does not allow (HTTP 403)."""


class RateLimited(RuntimeError, GpuclusterError):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Identity:
    user: str
    cluster_admin: bool = False
    teams: Mapping[str, str] = field(default_factory=dict)  # team -> role, the default team first
    token_id: int | None = None
    unix_user: str | None = None
    job_id: int | None = None  # set for a job's own token: it may only report that job's progress

    @property
    def is_job(self) -> bool:
        return self.job_id is not None

    def role_in(self, team: str) -> str | None:
        return self.teams.get(team)

    def can_see(self, team: str) -> bool:
        return self.cluster_admin or team in self.teams

    def can_operate(self, team: str, owner: str | None) -> bool:
        if self.cluster_admin or self.teams.get(team) == TEAM_ADMIN:
            return True
        return team in self.teams and owner is not None and owner == self.user

    def visible_teams(self) -> list[str] | None:
        """The teams whose jobs this caller may see; None means all of them."""
        return None if self.cluster_admin else list(self.teams)

    def submit_team(self, asked: str | None) -> str:
        """The team a new job is accounted to: the one asked for, if the caller belongs to it."""
        if asked is None:
            if self.teams:
                return next(iter(self.teams))
            if self.cluster_admin:
                return "default"
            raise Denied(f"user {self.user} belongs to no team; a cluster admin can add you to one")
        if self.cluster_admin or asked in self.teams:
            return asked
        yours = ", ".join(self.teams) or "none"
        raise Denied(f"team: you ({self.user}) are not a member of team {asked!r}; your teams: {yours}")

    def describe_teams(self) -> str:
        return ", ".join(self.teams) or "none"
