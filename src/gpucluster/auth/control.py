"""The head's access control: authenticate a bearer token, manage users and tokens, audit.

Identities are cached in memory by token digest: every API call needs one, and this head is the
only writer of the store, so every change (a new user, a role, a revocation) goes through here
and clears the cache at once. Expiry is checked on every call, cached or not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpucluster.auth import tokens as tok
from gpucluster.auth import unix
from gpucluster.auth.identity import CLUSTER_ADMIN, Denied, Identity, RateLimited, Unauthorized
from gpucluster.auth.ratelimit import RateLimiter
from gpucluster.head.service import Rejected
from gpucluster.store import JobRecord, Store
from gpucluster.store.access import (
    MEMBER,
    TEAM_ADMIN,
    AccessConflict,
    AccessStore,
    AuditRecord,
    TokenRecord,
    UserRecord,
)

log = logging.getLogger("gpucluster.auth")

DEFAULT_RATE_PER_S = 100.0  # per token; cluster admins are not limited
# How long an account seen on the head answers `check_can_run` without asking pwd again. The
# lookup opens and parses /etc/passwd (or asks NSS) on the event loop, per submission: 5% of the
# head's CPU in the submit phases (issue 18), and hundreds of microseconds the loop serves no one
# under load. Kept short, and only for accounts that exist: the check only refuses early a job
# that could never start; the node looks the account up again at the job's start, so a stale
# entry never changes who a job runs as, only lets a submission through that fails at its start.
ACCOUNT_SEEN_S = 5.0
JOB_KEY = "job_token_key"
JOB_TOKEN_ENV = "GPUCLUSTER_JOB_TOKEN"


@dataclass(frozen=True)
class _Cached:
    identity: Identity
    expires_at: float | None


class AccessControl:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        *,
        rate_per_s: float = DEFAULT_RATE_PER_S,
        burst: float | None = None,
        run_as_submitter: bool | None = None,
    ) -> None:
        self.store = AccessStore(store)
        self.clock = clock
        self.limiter = RateLimiter(rate_per_s, burst, clock)
        # A root head runs each job as its submitter's Unix account; any other runs them as itself.
        self.run_as_submitter = unix.head_is_root() if run_as_submitter is None else run_as_submitter
        self._job_key = self.store.secret(JOB_KEY)
        self._cache: dict[str, _Cached] = {}
        # Owner -> the Unix account name their jobs run as (run_as), read at every job start
        # (issue 18: the head's CPU per job). Cleared by every change to users (`_changed`), as the
        # identities are; `_generation` keeps a read that raced a change from being kept after it.
        self._accounts: dict[str, str] = {}
        # Account name -> when pwd last found it (check_can_run; ACCOUNT_SEEN_S says the bound).
        self._seen_accounts: dict[str, float] = {}
        self._generation = 0
        self._lock = threading.Lock()

    # ---- who is calling ---------------------------------------------------------------------

    def authenticate(self, token: str | None) -> Identity:
        """The caller behind a bearer token; Unauthorized if none or not (any more) valid."""
        if not token:
            raise Unauthorized(
                "no token: send `Authorization: Bearer <token>` (the CLI and SDK take --token, "
                "GPUCLUSTER_TOKEN, or the config file `gpucluster up` writes)"
            )
        if len(token) > tok.MAX_TOKEN_LENGTH:
            raise Unauthorized("token is not valid")
        if token.startswith(tok.JOB_PREFIX):
            job_id = tok.job_of_token(self._job_key, token)
            if job_id is None:
                raise Unauthorized("job token is not valid")
            return Identity(user=f"job-{job_id}", job_id=job_id)
        key = tok.digest(token)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is None:
            hit = self._load(key)
        if hit.expires_at is not None and now >= hit.expires_at:
            raise Unauthorized(f"token {hit.identity.token_id} expired; ask a cluster admin for a new one")
        return hit.identity

    def _load(self, key: str) -> _Cached:
        record = self.store.token_by_hash(key)
        if record is None:
            raise Unauthorized("token is not valid (unknown)")
        if record.revoked_at is not None:
            raise Unauthorized(f"token {record.id} was revoked; ask a cluster admin for a new one")
        user = self.store.user(record.user)
        if user is None:
            raise Unauthorized("token is not valid (its user is gone)")
        identity = Identity(
            user=user.name,
            cluster_admin=user.cluster_admin,
            teams=dict(user.teams),
            token_id=record.id,
            unix_user=user.unix_user,
        )
        cached = _Cached(identity, record.expires_at)
        with self._lock:
            self._cache[key] = cached
        return cached

    def _changed(self) -> None:
        with self._lock:
            self._cache.clear()
            self._accounts.clear()
            self._seen_accounts.clear()
            self._generation += 1

    def check_rate(self, who: Identity) -> None:
        """RateLimited when the caller's token has spent its budget (cluster admins have none)."""
        if who.cluster_admin:
            return
        key = f"job:{who.job_id}" if who.is_job else f"token:{who.token_id}"
        wait = self.limiter.take(key)
        if wait > 0:
            raise RateLimited(
                f"rate limit: more than {self.limiter.rate:g} requests/s with this token; retry in {wait:.2f} s",
                wait,
            )

    def job_token(self, job_id: int) -> str:
        return tok.job_token(self._job_key, job_id)

    def job_env(self, job: JobRecord) -> dict[str, str]:
        """A job's own token, for its progress reports (gpucluster.train sends it)."""
        return {JOB_TOKEN_ENV: self.job_token(job.id)}

    # ---- running jobs as their users ----------------------------------------------------------

    def run_as(self, owner: str | None) -> str | None:
        """The Unix account a job of `owner` runs as; None: the head's own.

        The account's name only, kept until the next change to users through this head (the
        store's only writer: `gpucluster admin` goes through its API). Never its uid: the node
        looks the name up (pwd) at each start, so an account removed or renumbered on the
        machine is seen by the next start, cached name or not."""
        if not self.run_as_submitter or owner is None:
            return None
        with self._lock:
            account = self._accounts.get(owner)
            generation = self._generation
        if account is None:
            account = unix.account_for(owner, self.store.unix_user(owner))
            with self._lock:
                if generation == self._generation:  # no change to users since the read began
                    self._accounts[owner] = account
        return account

    def check_can_run(self, who: Identity) -> None:
        """Refuse a submission whose job could not run as its submitter."""
        if not self.run_as_submitter:
            return
        account = unix.account_for(who.user, who.unix_user)
        if not self._account_exists(account):
            raise Denied(
                f"the head runs jobs as their submitter's Unix account, and there is no account {account!r} "
                f"on it; a cluster admin can map you to one: gpucluster admin add-user ... --unix-user NAME"
            )

    def _account_exists(self, account: str) -> bool:
        """pwd's answer, an account found kept for ACCOUNT_SEEN_S (its comment says why that is
        safe); a missing one is asked again every time, so an account just created is seen at once."""
        now = self.clock()
        with self._lock:
            seen = self._seen_accounts.get(account)
            generation = self._generation
        if seen is not None and 0 <= now - seen < ACCOUNT_SEEN_S:
            return True
        if not unix.account_exists(account):
            return False
        with self._lock:
            if generation == self._generation:
                self._seen_accounts[account] = now
        return True

    def jobs_run_as(self, who: Identity) -> str:
        if not self.run_as_submitter:
            return unix.head_account()
        return unix.account_for(who.user, who.unix_user)

    # ---- users and tokens ---------------------------------------------------------------------

    def bootstrap(self, name: str, unix_user: str | None) -> str | None:
        """On a store with no users, create cluster admin `name` and return its token."""
        if self.store.has_users():
            return None
        user = self.store.add_user(name, [], cluster_admin=True, unix_user=unix_user, now=self.clock())
        self._changed()
        token, _ = self.issue_token(user.name, None, "created by the first `gpucluster up`")
        self.record(name, "add-user", f"user {name}", "cluster-admin (first start)")
        return token

    def add_user(
        self,
        name: str,
        teams: list[str],
        role: str,
        unix_user: str | None,
        expires_in_s: float | None,
    ) -> tuple[UserRecord, str, int]:
        if role != CLUSTER_ADMIN and not teams:
            raise Rejected("teams", "a member or team admin needs at least one team (--team)")
        if unix_user is not None and not unix.account_exists(unix_user):
            raise Rejected("unix_user", f"there is no Unix account {unix_user!r} on the head")
        team_role = TEAM_ADMIN if role in (TEAM_ADMIN, CLUSTER_ADMIN) else MEMBER
        user = self.store.add_user(
            name,
            [(t, team_role) for t in teams],
            cluster_admin=role == CLUSTER_ADMIN,
            unix_user=unix_user,
            now=self.clock(),
        )
        token, token_id = self.issue_token(name, expires_in_s, "")
        self._changed()
        return user, token, token_id

    def account_warning(self, name: str) -> str | None:
        """Why `name`'s jobs could not run on this head as things stand, or None.

        Said when a user is created or changed, not at their first refused submission: a root
        head runs each job as its submitter's Unix account, and `add-user alice` without an
        account `alice` used to succeed silently."""
        user = self.store.user(name)
        if not self.run_as_submitter or user is None:
            return None
        account = unix.account_for(name, user.unix_user)
        if unix.account_exists(account):
            return None
        return (
            f"there is no Unix account {account!r} on the head, so {name}'s submissions are refused until "
            f"it exists or `gpucluster admin set-user {name} --unix-user ACCOUNT` maps them to one"
        )

    def update_user(self, name: str, unix_user: str | bool | None, cluster_admin: bool | None) -> UserRecord:
        """unix_user: an account (which must exist), None for the default (their name), False: unchanged."""
        if isinstance(unix_user, str) and not unix.account_exists(unix_user):
            raise Rejected("unix_user", f"there is no Unix account {unix_user!r} on the head")
        user = self.store.update_user(name, unix_user=unix_user, cluster_admin=cluster_admin)
        self._changed()
        return user

    def delete_user(self, name: str) -> UserRecord:
        user = self.store.delete_user(name)
        self._changed()  # their tokens are gone: no cached identity may outlive them
        return user

    def set_membership(self, name: str, team: str, role: str | None) -> UserRecord:
        user = self.store.set_membership(name, team, role)
        self._changed()
        return user

    def issue_token(self, user: str, expires_in_s: float | None, note: str) -> tuple[str, int]:
        if self.store.user(user) is None:
            raise AccessConflict(f"no user {user!r}; see `gpucluster admin users`")
        now = self.clock()
        token = tok.new_token()
        token_id = self.store.add_token(
            user, tok.digest(token), now, now + expires_in_s if expires_in_s is not None else None, note
        )
        return token, token_id

    def revoke(self, token_id: int) -> TokenRecord | None:
        record = self.store.revoke(token_id, self.clock())
        self._changed()
        return record

    def users(self) -> list[UserRecord]:
        return self.store.users()

    def user(self, name: str) -> UserRecord | None:
        return self.store.user(name)

    def tokens(self, user: str | None = None) -> list[TokenRecord]:
        return self.store.tokens(user)

    def token_status(self, t: TokenRecord) -> str:
        if t.revoked_at is not None:
            return "revoked"
        if t.expires_at is not None and self.clock() >= t.expires_at:
            return "expired"
        return "active"

    # ---- audit ------------------------------------------------------------------------------

    def record(self, user: str, action: str, target: str = "", detail: str = "") -> None:
        self.store.add_audit(self.clock(), user, action, target, detail)

    def audit(
        self, limit: int = 100, since: float | None = None, user: str | None = None, action: str | None = None
    ) -> list[AuditRecord]:
        return self.store.audit(limit=limit, since=since, user=user, action=action)
