"""Durable identity and access: users, their teams and roles, token hashes, the audit log.

Kept apart from `Store` (jobs) but in the same SQLite file and transactions discipline: one
head owns the file, every write is durable before the API answers. Tokens are stored only as
SHA-256 digests, so a leaked database holds no usable credential.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, cast, delete, func, insert, literal, select, union_all, update

from gpucluster.errors import GpuclusterError
from gpucluster.store import schema
from gpucluster.store.store import Store

MEMBER = "member"
TEAM_ADMIN = "team-admin"
TEAM_ROLES = (MEMBER, TEAM_ADMIN)


class AccessConflict(ValueError, GpuclusterError):
    """A user or membership that cannot be created as asked (exists already, unknown user)."""


@dataclass(frozen=True)
class UserRecord:
    name: str
    cluster_admin: bool
    unix_user: str | None
    created_at: float
    teams: tuple[tuple[str, str], ...]  # (team, role), the default team first


@dataclass(frozen=True)
class TokenRecord:
    id: int
    user: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    note: str


@dataclass(frozen=True)
class AuditRecord:
    at: float
    user: str
    action: str
    target: str
    detail: str


class AccessStore:
    def __init__(self, store: Store) -> None:
        self._store = store

    # ---- users and teams ------------------------------------------------------------------

    def has_users(self) -> bool:
        with self._store._read() as c:
            return c.execute(select(func.count()).select_from(schema.users)).scalar_one() > 0

    def add_user(
        self,
        name: str,
        teams: Iterable[tuple[str, str]],
        *,
        cluster_admin: bool,
        unix_user: str | None,
        now: float,
    ) -> UserRecord:
        teams = list(teams)
        with self._store._write() as c:
            if c.execute(select(schema.users.c.name).where(schema.users.c.name == name)).first():
                raise AccessConflict(f"user {name!r} exists already; see `gpucluster admin users`")
            c.execute(
                insert(schema.users).values(name=name, cluster_admin=cluster_admin, unix_user=unix_user, created_at=now)
            )
            if teams:
                c.execute(
                    insert(schema.memberships),
                    [{"user": name, "team": t, "role": r, "position": n} for n, (t, r) in enumerate(teams)],
                )
        user = self.user(name)
        assert user is not None
        return user

    def set_membership(self, name: str, team: str, role: str | None) -> UserRecord:
        """Add `name` to `team` with `role`, change the role, or (role None) remove it."""
        m = schema.memberships.c
        with self._store._write() as c:
            if not c.execute(select(schema.users.c.name).where(schema.users.c.name == name)).first():
                raise AccessConflict(f"no user {name!r}; see `gpucluster admin users`")
            c.execute(delete(schema.memberships).where(m.user == name, m.team == team))
            if role is not None:
                last = c.execute(select(func.max(m.position)).where(m.user == name)).scalar()
                c.execute(
                    insert(schema.memberships).values(
                        user=name, team=team, role=role, position=(last + 1) if last is not None else 0
                    )
                )
        user = self.user(name)
        assert user is not None
        return user

    def update_user(
        self, name: str, *, unix_user: str | bool | None = False, cluster_admin: bool | None = None
    ) -> UserRecord:
        """Change a user's Unix account (None: the default, their name; False: unchanged) or
        cluster-admin flag (None: unchanged). Refuses to leave the cluster with no cluster admin."""
        u = schema.users.c
        values: dict[str, object] = {}
        if unix_user is not False:
            values["unix_user"] = unix_user
        if cluster_admin is not None:
            values["cluster_admin"] = cluster_admin
        with self._store._write() as c:
            found = c.execute(select(u.cluster_admin).where(u.name == name)).first()
            if found is None:
                raise AccessConflict(f"no user {name!r}; see `gpucluster admin users`")
            if cluster_admin is False and found[0] and self._admins(c) <= 1:
                raise AccessConflict(f"{name} is the only cluster admin; make another one first")
            if values:
                c.execute(schema.users.update().where(u.name == name).values(**values))
        user = self.user(name)
        assert user is not None
        return user

    def delete_user(self, name: str) -> UserRecord:
        """Remove a user, their team memberships and their tokens (revoked by being gone). Their
        jobs and audit entries stay, under their name; refused while jobs of theirs are queued or
        running (they would run as someone no longer known), and for the last cluster admin."""
        u, j = schema.users.c, schema.jobs.c
        user = self.user(name)
        if user is None:
            raise AccessConflict(f"no user {name!r}; see `gpucluster admin users`")
        with self._store._write() as c:
            active = c.execute(
                select(func.count())
                .select_from(schema.jobs)
                .where(j.owner == name, j.state.in_(("queued", "running", "preempted")))
            ).scalar_one()
            if active:
                raise AccessConflict(f"{name} has {active} queued or running job(s); cancel them first")
            if user.cluster_admin and self._admins(c) <= 1:
                raise AccessConflict(f"{name} is the only cluster admin; make another one first")
            c.execute(delete(schema.memberships).where(schema.memberships.c.user == name))
            c.execute(delete(schema.tokens).where(schema.tokens.c.user == name))
            c.execute(delete(schema.users).where(u.name == name))
        return user

    @staticmethod
    def _admins(c: Any) -> int:
        u = schema.users.c
        return int(c.execute(select(func.count()).select_from(schema.users).where(u.cluster_admin)).scalar_one())

    def user(self, name: str) -> UserRecord | None:
        found = self.users([name])
        return found[0] if found else None

    def unix_user(self, name: str) -> str | None:
        """The Unix account `name` is mapped to (None: not mapped, or no such user). One column
        of one row: asked at every job start (auth/control.py run_as), where reading the whole
        user with its teams cost more than the rest of the launch spec."""
        u = schema.users.c
        with self._store._read() as c:
            value = c.execute(select(u.unix_user).where(u.name == name)).scalar()
        return None if value is None else str(value)

    def users(self, names: Iterable[str] | None = None) -> list[UserRecord]:
        u, m = schema.users.c, schema.memberships.c
        q = select(schema.users).order_by(u.name)
        mq = select(m.user, m.team, m.role).order_by(m.user, m.position, m.team)
        if names is not None:
            wanted = list(names)
            q = q.where(u.name.in_(wanted))
            mq = mq.where(m.user.in_(wanted))
        with self._store._read() as c:
            rows = c.execute(q).mappings().all()
            teams: dict[str, list[tuple[str, str]]] = {}
            for user, team, role in c.execute(mq).all():
                teams.setdefault(user, []).append((team, role))
        return [
            UserRecord(
                name=r["name"],
                cluster_admin=bool(r["cluster_admin"]),
                unix_user=r["unix_user"],
                created_at=r["created_at"],
                teams=tuple(teams.get(r["name"], ())),
            )
            for r in rows
        ]

    # ---- tokens -----------------------------------------------------------------------------

    def add_token(self, user: str, sha256: str, now: float, expires_at: float | None, note: str = "") -> int:
        with self._store._write() as c:
            res = c.execute(
                insert(schema.tokens)
                .values(user=user, sha256=sha256, created_at=now, expires_at=expires_at, note=note)
                .returning(schema.tokens.c.id)
            )
            return int(res.scalar_one())

    def token_by_hash(self, sha256: str) -> TokenRecord | None:
        with self._store._read() as c:
            row = c.execute(select(schema.tokens).where(schema.tokens.c.sha256 == sha256)).mappings().first()
        return _token(row) if row else None

    def tokens(self, user: str | None = None) -> list[TokenRecord]:
        q = select(schema.tokens).order_by(schema.tokens.c.id)
        if user is not None:
            q = q.where(schema.tokens.c.user == user)
        with self._store._read() as c:
            return [_token(r) for r in c.execute(q).mappings().all()]

    def revoke(self, token_id: int, now: float) -> TokenRecord | None:
        """Revoke one token (idempotent); None if there is no such token."""
        t = schema.tokens.c
        with self._store._write() as c:
            c.execute(update(schema.tokens).where(t.id == token_id, t.revoked_at.is_(None)).values(revoked_at=now))
            row = c.execute(select(schema.tokens).where(t.id == token_id)).mappings().first()
        return _token(row) if row else None

    # ---- secrets ----------------------------------------------------------------------------

    def secret(self, key: str) -> bytes:
        """A random secret kept in the store (created on first use): signs jobs' own tokens."""
        meta = schema.meta.c
        with self._store._write() as c:
            row = c.execute(select(meta.value).where(meta.key == key)).first()
            if row is not None:
                return bytes.fromhex(row[0])
            value = secrets.token_bytes(32)
            c.execute(insert(schema.meta).values(key=key, value=value.hex()))
            return value

    # ---- audit ------------------------------------------------------------------------------

    def add_audit(self, at: float, user: str, action: str, target: str = "", detail: str = "") -> None:
        with self._store._write() as c:
            c.execute(insert(schema.audit).values(at=at, user=user, action=action, target=target, detail=detail))

    def audit(
        self,
        *,
        limit: int = 100,
        since: float | None = None,
        user: str | None = None,
        action: str | None = None,
    ) -> list[AuditRecord]:
        """The newest `limit` entries, oldest first: the audit table plus every submission."""
        a, j = schema.audit.c, schema.jobs.c
        logged = select(a.at, a.user, a.action, a.target, a.detail)
        submitted = select(
            j.submitted_at.label("at"),
            func.coalesce(j.owner, "").label("user"),
            literal("submit").label("action"),
            ("job " + cast(j.id, String)).label("target"),
            ("team " + j.team).label("detail"),
        )
        if since is not None:
            logged = logged.where(a.at >= since)
            submitted = submitted.where(j.submitted_at >= since)
        if user is not None:
            logged = logged.where(a.user == user)
            submitted = submitted.where(j.owner == user)
        parts: list[Any] = []
        if action in (None, "submit"):
            parts.append(submitted)
        if action != "submit":
            parts.append(logged if action is None else logged.where(a.action == action))
        both = union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()
        q = select(both).order_by(both.c.at.desc()).limit(limit)
        with self._store._read() as c:
            rows = c.execute(q).all()
        return [AuditRecord(at=r[0], user=r[1], action=r[2], target=r[3], detail=r[4]) for r in reversed(rows)]


def _token(r: Any) -> TokenRecord:
    return TokenRecord(
        id=r["id"],
        user=r["user"],
        created_at=r["created_at"],
        expires_at=r["expires_at"],
        revoked_at=r["revoked_at"],
        note=r["note"],
    )
