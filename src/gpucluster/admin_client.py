"""The admin half of the SDK (users, tokens, audit) and `whoami`; mixed into `gpucluster.Client`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucluster.auth.wire import AuditEntry, NewToken, TokenOut, UserChanged, UserOut, WhoAmI
    from gpucluster.connection import Answer

# The admin wire models are imported at the first admin call (each method imports its own):
# every other command, and the SDK in a job, does without their ~10 ms of import (issue 19).


class AdminCalls:
    def _request(self, method: str, path: str, params: dict[str, Any] | None = None, json: Any = None) -> Answer:
        raise NotImplementedError

    def whoami(self) -> WhoAmI:
        from gpucluster.auth.wire import WhoAmI

        return WhoAmI.model_validate(self._request("GET", "/v1/whoami").json())

    def users(self) -> list[UserOut]:
        from gpucluster.auth.wire import UserList

        return UserList.model_validate(self._request("GET", "/v1/admin/users").json()).users

    def add_user(
        self,
        name: str,
        teams: list[str],
        role: str = "member",
        unix_user: str | None = None,
        expires_in: str | float | None = None,
    ) -> NewToken:
        """Create a user and their first token (returned once; the head keeps only its hash)."""
        body = {"name": name, "teams": teams, "role": role, "unix_user": unix_user, "expires_in": expires_in}
        from gpucluster.auth.wire import NewToken

        return NewToken.model_validate(self._request("POST", "/v1/admin/users", json=body).json())

    def set_membership(self, name: str, team: str, role: str | None = "member") -> UserOut:
        """Put a user in a team with a role, change it, or (role None) take them out."""
        r = self._request("PUT", f"/v1/admin/users/{name}/membership", json={"team": team, "role": role})
        from gpucluster.auth.wire import UserOut

        return UserOut.model_validate(r.json())

    def update_user(self, name: str, **changes: Any) -> UserChanged:
        """Change a user: unix_user="acct" (None: the default, their name), cluster_admin=True/False.
        Only the fields given change; the answer carries a warning when their jobs could not run."""
        from gpucluster.auth.wire import UserChanged

        return UserChanged.model_validate(self._request("PATCH", f"/v1/admin/users/{name}", json=changes).json())

    def delete_user(self, name: str) -> UserOut:
        """Remove a user, their memberships and tokens (refused while jobs of theirs are active)."""
        from gpucluster.auth.wire import UserOut

        return UserOut.model_validate(self._request("DELETE", f"/v1/admin/users/{name}").json())

    def new_token(self, name: str, expires_in: str | float | None = None, note: str = "") -> NewToken:
        body = {"expires_in": expires_in, "note": note}
        from gpucluster.auth.wire import NewToken

        return NewToken.model_validate(self._request("POST", f"/v1/admin/users/{name}/tokens", json=body).json())

    def tokens(self, user: str | None = None) -> list[TokenOut]:
        params = {"user": user} if user else {}
        from gpucluster.auth.wire import TokenList

        return TokenList.model_validate(self._request("GET", "/v1/admin/tokens", params=params).json()).tokens

    def revoke(self, token_id: int) -> TokenOut:
        from gpucluster.auth.wire import TokenOut

        return TokenOut.model_validate(self._request("POST", f"/v1/admin/tokens/{token_id}/revoke").json())

    def audit(
        self, limit: int = 100, since: float | None = None, user: str | None = None, action: str | None = None
    ) -> list[AuditEntry]:
        params: dict[str, Any] = {"limit": limit}
        for k, v in (("since", since), ("user", user), ("action", action)):
            if v is not None:
                params[k] = v
        from gpucluster.auth.wire import AuditList

        return AuditList.model_validate(self._request("GET", "/v1/admin/audit", params=params).json()).entries
