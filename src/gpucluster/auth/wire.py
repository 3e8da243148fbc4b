"""Wire format of the admin API (users, tokens, audit), shared by the API, the client and the CLI."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from gpucluster.durations import parse_duration
from gpucluster.models import Model, Name, StorableText

Role = Literal["member", "team-admin", "cluster-admin"]
MAX_EXPIRY_S = 10 * 366 * 86400


def _expiry(value: float | str | None) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    if not 0 < seconds <= MAX_EXPIRY_S:
        raise ValueError("must be between 1s and 10 years")
    return seconds


class UserIn(StorableText):
    """A new user: their teams (the first is their default), role, and Unix account."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    teams: list[Name] = Field(default_factory=list, max_length=64)
    role: Role = "member"
    unix_user: str | None = Field(
        None, max_length=32, pattern=r"^[a-z_][a-z0-9_.-]*\$?$", description="[default: the user's name]"
    )
    expires_in: float | str | None = Field(None, description="the first token's lifetime, e.g. 90d [default: none]")

    @field_validator("expires_in")
    @classmethod
    def _check_expiry(cls, v: float | str | None) -> float | None:
        return _expiry(v)

    @field_validator("teams")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a team is listed twice")
        return v


class MembershipIn(StorableText):
    """Put a user in a team with a role, change it, or (role null) take them out."""

    model_config = ConfigDict(extra="forbid")

    team: Name
    role: Literal["member", "team-admin"] | None = "member"


class TokenIn(StorableText):
    model_config = ConfigDict(extra="forbid")

    expires_in: float | str | None = Field(None, description="e.g. 90d [default: never]")
    note: str = Field("", max_length=256)

    @field_validator("expires_in")
    @classmethod
    def _check_expiry(cls, v: float | str | None) -> float | None:
        return _expiry(v)


class TeamRole(Model):
    team: str
    role: str


class UserOut(Model):
    name: str
    cluster_admin: bool
    unix_user: str | None
    created_at: float
    teams: list[TeamRole]


class TokenOut(Model):
    id: int
    user: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    note: str
    status: Literal["active", "expired", "revoked"]


class NewToken(Model):
    """A token is shown here once; the head keeps only its SHA-256."""

    token: str
    token_id: int
    user: UserOut
    warning: str | None = None  # why the user's jobs could not run yet, e.g. no Unix account on the head


class UserPatch(StorableText):
    """Change a user: their Unix account (null: the default, their name) or cluster-admin flag.
    A field left out stays as it is."""

    model_config = ConfigDict(extra="forbid")

    unix_user: str | None = Field(None, max_length=32, pattern=r"^[a-z_][a-z0-9_.-]*\$?$")
    cluster_admin: bool | None = None


class UserChanged(Model):
    """A changed user, with a warning when their jobs could not run as things stand."""

    user: UserOut
    warning: str | None = None


class UserList(Model):
    users: list[UserOut]


class TokenList(Model):
    tokens: list[TokenOut]


class AuditEntry(Model):
    at: float
    user: str
    action: str
    target: str
    detail: str


class AuditList(Model):
    entries: list[AuditEntry]


class WhoAmI(Model):
    user: str
    cluster_admin: bool
    teams: list[TeamRole]
    token_id: int | None
    runs_jobs_as: str
