"""The admin half of the SDK (users, tokens, audit) and `whoami`; mixed into `gpucluster.Client`."""

from __future__ import annotations

from typing import Any

import httpx

from gpucluster.auth.wire import AuditEntry, AuditList, NewToken, TokenList, TokenOut, UserList, UserOut, WhoAmI


class AdminCalls:
    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        raise NotImplementedError

    def whoami(self) -> WhoAmI:
        return WhoAmI.model_validate(self._request("GET", "/v1/whoami").json())

    def users(self) -> list[UserOut]:
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
        return NewToken.model_validate(self._request("POST", "/v1/admin/users", json=body).json())

    def set_membership(self, name: str, team: str, role: str | None = "member") -> UserOut:
        """Put a user in a team with a role, change it, or (role None) take them out."""
        r = self._request("PUT", f"/v1/admin/users/{name}/membership", json={"team": team, "role": role})
        return UserOut.model_validate(r.json())

    def new_token(self, name: str, expires_in: str | float | None = None, note: str = "") -> NewToken:
        body = {"expires_in": expires_in, "note": note}
        return NewToken.model_validate(self._request("POST", f"/v1/admin/users/{name}/tokens", json=body).json())

    def tokens(self, user: str | None = None) -> list[TokenOut]:
        params = {"user": user} if user else {}
        return TokenList.model_validate(self._request("GET", "/v1/admin/tokens", params=params).json()).tokens

    def revoke(self, token_id: int) -> TokenOut:
        return TokenOut.model_validate(self._request("POST", f"/v1/admin/tokens/{token_id}/revoke").json())

    def audit(
        self, limit: int = 100, since: float | None = None, user: str | None = None, action: str | None = None
    ) -> list[AuditEntry]:
        params: dict[str, Any] = {"limit": limit}
        for k, v in (("since", since), ("user", user), ("action", action)):
            if v is not None:
                params[k] = v
        return AuditList.model_validate(self._request("GET", "/v1/admin/audit", params=params).json()).entries
