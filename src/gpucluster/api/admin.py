"""Users, tokens and the audit log over HTTP (cluster admins only), and `whoami` for everyone."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query, Request

from gpucluster.api.errors import Id
from gpucluster.auth.control import AccessControl
from gpucluster.auth.rules import Caller, Rule, allow, note_audit
from gpucluster.auth.wire import (
    AuditEntry,
    AuditList,
    MembershipIn,
    NewToken,
    TeamRole,
    TokenIn,
    TokenList,
    TokenOut,
    UserChanged,
    UserIn,
    UserList,
    UserOut,
    UserPatch,
    WhoAmI,
)
from gpucluster.head.service import Conflict, NotFound
from gpucluster.models import Name
from gpucluster.store.access import AccessConflict, TokenRecord, UserRecord


def user_out(u: UserRecord) -> UserOut:
    return UserOut(
        name=u.name,
        cluster_admin=u.cluster_admin,
        unix_user=u.unix_user,
        created_at=u.created_at,
        teams=[TeamRole(team=t, role=r) for t, r in u.teams],
    )


def add_admin_routes(app: FastAPI, control: AccessControl) -> None:
    def token_out(t: TokenRecord) -> TokenOut:
        return TokenOut(
            id=t.id,
            user=t.user,
            created_at=t.created_at,
            expires_at=t.expires_at,
            revoked_at=t.revoked_at,
            note=t.note,
            status=control.token_status(t),  # type: ignore[arg-type]
        )

    def _user(name: str) -> UserRecord:
        u = control.user(name)
        if u is None:
            raise NotFound(f"no user {name!r}; see `gpucluster admin users`")
        return u

    @app.get("/v1/whoami", openapi_extra=allow(Rule.SIGNED_IN))
    def whoami(who: Caller) -> WhoAmI:
        """The caller: user name, teams with roles, and the Unix account their jobs run as."""
        return WhoAmI(
            user=who.user,
            cluster_admin=who.cluster_admin,
            teams=[TeamRole(team=t, role=r) for t, r in who.teams.items()],
            token_id=who.token_id,
            runs_jobs_as=control.jobs_run_as(who),
        )

    @app.get("/v1/admin/users", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def users() -> UserList:
        return UserList(users=[user_out(u) for u in control.users()])

    @app.post("/v1/admin/users", status_code=201, openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def add_user(body: UserIn, request: Request) -> NewToken:
        """Create a user with a first token; the token is in this answer only."""
        note_audit(request, f"user {body.name}", f"{body.role} of {', '.join(body.teams) or 'no team'}")
        try:
            user, token, token_id = control.add_user(
                body.name,
                body.teams,
                body.role,
                body.unix_user,
                body.expires_in,  # type: ignore[arg-type]
            )
        except AccessConflict as e:
            raise Conflict(str(e)) from None
        return NewToken(token=token, token_id=token_id, user=user_out(user), warning=control.account_warning(body.name))

    @app.patch("/v1/admin/users/{name}", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def update_user(name: Name, body: UserPatch, request: Request) -> UserChanged:
        """Change a user's Unix account (null: their name) or make them a cluster admin, or not."""
        given = body.model_fields_set
        unix_user: str | bool | None = body.unix_user if "unix_user" in given else False
        changes = [f"unix account {body.unix_user or 'default'}"] if "unix_user" in given else []
        changes += [f"cluster admin {body.cluster_admin}"] if body.cluster_admin is not None else []
        note_audit(request, f"user {name}", ", ".join(changes) or "nothing")
        _user(name)
        try:
            user = control.update_user(name, unix_user, body.cluster_admin)
        except AccessConflict as e:
            raise Conflict(str(e)) from None
        return UserChanged(user=user_out(user), warning=control.account_warning(name))

    @app.delete("/v1/admin/users/{name}", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def delete_user(name: Name, request: Request) -> UserOut:
        """Remove a user with their memberships and tokens; their past jobs and audit entries stay."""
        note_audit(request, f"user {name}", "deleted")
        _user(name)
        try:
            return user_out(control.delete_user(name))
        except AccessConflict as e:
            raise Conflict(str(e)) from None

    @app.put("/v1/admin/users/{name}/membership", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def set_membership(name: Name, body: MembershipIn, request: Request) -> UserOut:
        """Put a user in a team with a role, change the role, or (role null) take them out."""
        note_audit(request, f"user {name}", f"team {body.team}: {body.role or 'removed'}")
        _user(name)
        return user_out(control.set_membership(name, body.team, body.role))

    @app.post("/v1/admin/users/{name}/tokens", status_code=201, openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def new_token(name: Name, body: TokenIn, request: Request) -> NewToken:
        """Another token for a user (their old ones stay valid until revoked or expired)."""
        user = _user(name)
        token, token_id = control.issue_token(name, body.expires_in, body.note)  # type: ignore[arg-type]
        note_audit(request, f"user {name}", f"token {token_id}")
        return NewToken(token=token, token_id=token_id, user=user_out(user))

    @app.get("/v1/admin/tokens", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def tokens(user: Annotated[Name | None, Query()] = None) -> TokenList:
        """Every token (never the token itself): whose, when made, expiry, revoked or not."""
        return TokenList(tokens=[token_out(t) for t in control.tokens(user)])

    @app.post("/v1/admin/tokens/{token_id}/revoke", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def revoke(token_id: Id, who: Caller) -> TokenOut:
        """Revoke a token at once: its next call gets 401."""
        if who.token_id == token_id and sum(1 for u in control.users() if u.cluster_admin) <= 1:
            active = [t for t in control.tokens(who.user) if control.token_status(t) == "active"]
            if len(active) <= 1:
                raise Conflict("that is the last token of the only cluster admin; make another admin token first")
        record = control.revoke(token_id)
        if record is None:
            raise NotFound(f"no token with id {token_id}; see `gpucluster admin tokens`")
        return token_out(record)

    @app.get("/v1/admin/audit", openapi_extra=allow(Rule.CLUSTER_ADMIN))
    def audit(
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        since: Annotated[float | None, Query(ge=0, description="Unix time")] = None,
        user: Annotated[Name | None, Query()] = None,
        action: Annotated[str | None, Query(max_length=64)] = None,
    ) -> AuditList:
        """Who submitted, cancelled, requeued, drained or changed policy or users, and when."""
        entries = control.audit(limit=limit, since=since, user=user, action=action)
        return AuditList(
            entries=[
                AuditEntry(at=e.at, user=e.user, action=e.action, target=e.target, detail=e.detail) for e in entries
            ]
        )
