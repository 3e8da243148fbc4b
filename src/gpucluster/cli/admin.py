"""`gpucluster admin ...` (users, tokens, audit; cluster admins only) and `gpucluster whoami`."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from gpucluster.cli.common import JsonOpt, UrlOpt, err, fail, out, print_json, ts
from gpucluster.cli.common import call as _call
from gpucluster.cli.common import client as _client
from gpucluster.cli.common import head as _head
from gpucluster.cli.console import Table
from gpucluster.durations import format_duration

admin_app: typer.Typer = typer.Typer(
    help="Users, teams, tokens and the audit log (cluster admins only).", no_args_is_help=True, rich_markup_mode=None
)

RoleOpt = Annotated[
    str,
    typer.Option(
        "--role",
        help="member (their teams' jobs; cancels their own), team-admin (any job of their teams), or cluster-admin",
    ),
]


def _roles(teams: list[tuple[str, str]]) -> str:
    return ", ".join(f"{t} ({r})" for t, r in teams) or "-"


def _expiry(t: float | None) -> str:
    if t is None:
        return "never"
    left = t - time.time()
    return f"{ts(t)} (in {format_duration(left)})" if left > 0 else ts(t)


@admin_app.command("add-user")
def add_user(
    name: Annotated[str, typer.Argument(help="user name")],
    team: Annotated[
        list[str] | None,
        typer.Option("--team", help="a team the user belongs to (repeatable; the first is the default)"),
    ] = None,
    role: RoleOpt = "member",
    unix_user: Annotated[
        str | None,
        typer.Option("--unix-user", help="Unix account a root head runs their jobs as [default: NAME]"),
    ] = None,
    expires: Annotated[str | None, typer.Option("--expires", help="token lifetime, e.g. 90d [default: never]")] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a user and print their token (shown once: the head keeps only its hash)."""
    with _client(url) as c:
        new = _call(c.add_user, name, team or [], role, unix_user, expires)
    if as_json:
        print_json({"token": new.token, "token_id": new.token_id, "user": new.user.model_dump(mode="json")})
        return
    teams = _roles([(t.team, t.role) for t in new.user.teams])
    out.print(
        f"created user {name} ({'cluster admin; ' if new.user.cluster_admin else ''}teams: {teams})", markup=False
    )
    out.print(f"token {new.token_id} (shown once; give it to {name}):", markup=False)
    out.print(new.token, markup=False)
    if new.warning:
        err.print(f"warning: {new.warning}", markup=False)


@admin_app.command("set-user")
def set_user(
    name: Annotated[str, typer.Argument(help="user name")],
    unix_user: Annotated[
        str | None,
        typer.Option("--unix-user", help="the Unix account a root head runs their jobs as; 'default': their name"),
    ] = None,
    cluster_admin: Annotated[
        bool | None,
        typer.Option("--cluster-admin/--no-cluster-admin", help="make them a cluster admin, or no longer one"),
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a user's Unix account, or make them a cluster admin (or not); the rest stays."""
    changes: dict[str, object] = {}
    if unix_user is not None:
        changes["unix_user"] = None if unix_user == "default" else unix_user
    if cluster_admin is not None:
        changes["cluster_admin"] = cluster_admin
    if not changes:
        fail("nothing to change: give --unix-user ACCOUNT and/or --cluster-admin/--no-cluster-admin")
    with _client(url) as c:
        changed = _call(c.update_user, name, **changes)
    if as_json:
        print_json(changed.model_dump(mode="json"))
        return
    u = changed.user
    role = "cluster admin; " if u.cluster_admin else ""
    out.print(f"{name}: {role}jobs run as {u.unix_user or name}", markup=False)
    if changed.warning:
        err.print(f"warning: {changed.warning}", markup=False)


@admin_app.command("delete-user")
def delete_user(
    name: Annotated[str, typer.Argument(help="user name")],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove a user with their team memberships and tokens; their past jobs and audit entries stay.
    Refused while they have queued or running jobs, and for the last cluster admin."""
    with _client(url) as c:
        gone = _call(c.delete_user, name)
    if as_json:
        print_json(gone.model_dump(mode="json"))
        return
    out.print(f"deleted user {name} (their tokens no longer work)", markup=False)


@admin_app.command("token")
def new_token(
    name: Annotated[str, typer.Argument(help="user name")],
    expires: Annotated[str | None, typer.Option("--expires", help="lifetime, e.g. 90d [default: never]")] = None,
    note: Annotated[str, typer.Option("--note", help="what the token is for")] = "",
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make another token for a user (e.g. to rotate one: make a new one, then revoke the old)."""
    with _client(url) as c:
        new = _call(c.new_token, name, expires, note)
    if as_json:
        print_json({"token": new.token, "token_id": new.token_id})
        return
    out.print(f"token {new.token_id} for {name} (shown once):", markup=False)
    out.print(new.token, markup=False)


@admin_app.command("member")
def member(
    name: Annotated[str, typer.Argument(help="user name")],
    team: Annotated[str, typer.Option("--team", help="the team")],
    role: Annotated[
        str,
        typer.Option(
            "--role", help="member or team-admin (a cluster admin: gpucluster admin set-user NAME --cluster-admin)"
        ),
    ] = "member",
    remove: Annotated[bool, typer.Option("--remove", help="take the user out of the team")] = False,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Put a user in a team, change their role in it, or take them out (--remove)."""
    with _client(url) as c:
        user = _call(c.set_membership, name, team, None if remove else role)
    if as_json:
        print_json(user.model_dump(mode="json"))
        return
    out.print(f"{name}: teams {_roles([(t.team, t.role) for t in user.teams])}", markup=False)


@admin_app.command("users")
def users(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Users with their teams and roles."""
    with _head(url) as h:  # the read commands print the head's JSON, without the SDK's models (issue 19)
        listing = _call(h.json, "GET", "/v1/admin/users").users
    if as_json:
        print_json(listing)
        return
    table = Table("USER", "CLUSTER ADMIN", "TEAMS (ROLE)", "UNIX ACCOUNT", "CREATED", box=None)
    for u in listing:
        table.add_row(
            u.name,
            "yes" if u.cluster_admin else "-",
            _roles([(t.team, t.role) for t in u.teams]),
            u.unix_user or "-",
            ts(u.created_at),
        )
    out.print(table)


@admin_app.command("tokens")
def tokens(
    user: Annotated[str | None, typer.Option("--user", help="only this user's tokens")] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Tokens (never the secrets): id, user, status, expiry."""
    with _head(url) as h:
        listing = _call(h.json, "GET", "/v1/admin/tokens", {"user": user} if user else None).tokens
    if as_json:
        print_json(listing)
        return
    table = Table("ID", "USER", "STATUS", "CREATED", "EXPIRES", "NOTE", box=None)
    for t in listing:
        table.add_row(str(t.id), t.user, t.status, ts(t.created_at), _expiry(t.expires_at), t.note or "-")
    out.print(table)


@admin_app.command("revoke")
def revoke(
    token_ids: Annotated[list[int], typer.Argument(help="token id(s), from `gpucluster admin tokens`")],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke tokens at once: their next call is refused (401)."""
    with _client(url) as c:
        done = [_call(c.revoke, t) for t in token_ids]
    if as_json:
        print_json([t.model_dump(mode="json") for t in done])
        return
    for t in done:
        out.print(f"token {t.id} of {t.user}: revoked", markup=False)


@admin_app.command("audit")
def audit(
    limit: Annotated[int, typer.Option(help="the newest N entries", min=1, max=10_000)] = 100,
    user: Annotated[str | None, typer.Option("--user", help="only this user's actions")] = None,
    action: Annotated[
        str | None,
        typer.Option(
            "--action", help="only this action: submit, cancel, requeue, drain, add-user, revoke, policy, ..."
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="a duration ago (1h, 7d), a date (2025-01-31) or all [default: all]")
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Who submitted, cancelled, requeued, drained, changed policy or users, and when (oldest first)."""
    from gpucluster.durations import parse_since

    try:
        start = parse_since(since, time.time()) if since else None
    except ValueError as e:
        fail(f"--since: {e}")
    query = {"limit": limit, "since": start, "user": user, "action": action}
    with _head(url) as h:
        entries = _call(h.json, "GET", "/v1/admin/audit", {k: v for k, v in query.items() if v is not None}).entries
    if as_json:
        print_json(entries)
        return
    table = Table("WHEN", "USER", "ACTION", "TARGET", "DETAIL", box=None)
    for entry in entries:
        table.add_row(ts(entry.at), entry.user or "-", entry.action, entry.target or "-", entry.detail or "-")
    out.print(table)


def whoami(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Who the head takes you for: user, teams and roles, and the Unix account your jobs run as."""
    with _head(url) as h:
        me = _call(h.json, "GET", "/v1/whoami")
    if as_json:
        print_json(me)
        return
    role = "cluster admin" if me.cluster_admin else "user"
    out.print(
        f"{me.user} ({role}); teams: {_roles([(t.team, t.role) for t in me.teams])}; jobs run as {me.runs_jobs_as}",
        markup=False,
    )
