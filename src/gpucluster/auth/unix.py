"""Which Unix account runs a user's jobs.

A head running as root runs each job as its submitter's account (the user's `unix_user`, or a
Unix account of the user's own name); a head running as anyone else runs every job as itself,
because it could not do otherwise, and says so once at start.
"""

from __future__ import annotations

import os
import pwd


def head_is_root() -> bool:
    return os.geteuid() == 0


def head_account() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def account_for(user: str, unix_user: str | None) -> str:
    return unix_user or user
