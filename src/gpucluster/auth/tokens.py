"""Bearer tokens: random, shown once, kept only as a SHA-256 digest.

A user's token is `gc_` + 32 random bytes (URL-safe base64): guessing one is hopeless, so a fast
unsalted hash is enough to store it and lets the head look it up by digest in one index probe.

A job's own token (`gcjob_<id>_<mac>`) is an HMAC of the job id under a secret kept in the store:
the head derives it again instead of storing one per job, and it only lets the job report its
own progress, so a job's environment (visible to anything the job runs) never holds a token
that could act for its user.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

USER_PREFIX = "gc_"
JOB_PREFIX = "gcjob_"
MAX_TOKEN_LENGTH = 256


def new_token() -> str:
    return USER_PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def job_token(key: bytes, job_id: int) -> str:
    mac = hmac.new(key, f"job:{job_id}".encode(), hashlib.sha256).hexdigest()[:40]
    return f"{JOB_PREFIX}{job_id}_{mac}"


def job_of_token(key: bytes, token: str) -> int | None:
    """The job id a job token was made for, or None if it is not a valid one."""
    if not token.startswith(JOB_PREFIX):
        return None
    head, _, _ = token[len(JOB_PREFIX) :].partition("_")
    if not head.isdigit() or len(head) > 18:
        return None
    job_id = int(head)
    return job_id if hmac.compare_digest(job_token(key, job_id), token) else None
