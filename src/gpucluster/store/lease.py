"""The one-head lease: a row in the database that says which head may write, until when.

Two heads scheduling one queue would start jobs twice and hand one GPU to two jobs. A lock held
by a session (PostgreSQL's advisory lock) vanishes silently when the server restarts, and the
head holding it never learns; so the guarantee is a row instead (`meta` key "head_lease": the
holder, an epoch and an expiry), which lives as long as the database does, on SQLite and
PostgreSQL alike:

- a head claims it when it starts (a new epoch), and renews it every third of its duration;
- every write transaction of a head that holds it first checks, under the database's write lock,
  that the row still names this head and epoch; if not, the transaction is rolled back and
  LeaseLost raised (a fencing token: takeovers are write transactions too, so a write and a
  takeover are ordered, and the write sees the takeover that came before it);
- a second head takes the lease only when it has expired (its holder stopped renewing), when it
  was released (a head that stopped cleanly), or when its holder is provably dead (same host, and
  the same data dir, whose file lock the new head now holds, or a pid that no longer exists);
  else it watches the row: a renewal proves the holder alive and the new head is refused.

Times are the database's clock on PostgreSQL (heads on different machines compare one clock),
this machine's on SQLite (a file, so one machine).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select, update

from gpucluster.store import schema

LEASE_KEY = "head_lease"
DEFAULT_LEASE_S = 15.0  # a dead head's database is free after at most this long
MIN_LEASE_S = 3.0
MAX_LEASE_S = 600.0
RENEW_FRACTION = 3  # renewed every duration / 3: two renewals may fail before it expires


@dataclass(frozen=True)
class Holder:
    """Who holds the lease: enough for an operator to find the process, and for a new head on
    the same machine to tell whether it is still alive."""

    host: str
    pid: int
    data_dir: str = ""

    @classmethod
    def this_process(cls, data_dir: str = "") -> Holder:
        return cls(socket.gethostname(), os.getpid(), data_dir)

    def describe(self) -> str:
        where = f" (data dir {self.data_dir})" if self.data_dir else ""
        return f"the head with pid {self.pid} on {self.host}{where}"

    def dead(self, claimer: Holder, claimer_holds_data_dir: bool) -> bool:
        """Whether this holder is certainly gone, as seen by `claimer` on its machine."""
        if self.host != claimer.host:
            return False  # another machine: only the expiry tells
        if claimer_holds_data_dir and self.data_dir and self.data_dir == claimer.data_dir:
            return True  # the claimer holds the data dir's exclusive lock: no other head runs on it
        if self.pid == claimer.pid:
            return True  # this very process, claiming again
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, someone else's
        return False


@dataclass(frozen=True)
class Lease:
    holder: Holder
    epoch: int
    expires_at: float  # the database's clock (see the module docstring); 0: released
    renewed_at: float
    duration_s: float

    def to_json(self) -> str:
        h = self.holder
        return json.dumps(
            {
                "holder": {"host": h.host, "pid": h.pid, "data_dir": h.data_dir},
                "epoch": self.epoch,
                "expires_at": self.expires_at,
                "renewed_at": self.renewed_at,
                "duration_s": self.duration_s,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Lease:
        d: dict[str, Any] = json.loads(text)
        h = d["holder"]
        return cls(
            Holder(str(h["host"]), int(h["pid"]), str(h.get("data_dir", ""))),
            int(d["epoch"]),
            float(d["expires_at"]),
            float(d["renewed_at"]),
            float(d["duration_s"]),
        )

    def same_claim(self, other: Lease) -> bool:
        """The same head's same claim: what a write checks (the fencing token)."""
        return self.holder == other.holder and self.epoch == other.epoch


def db_now(conn: Connection) -> float:
    """Seconds since the epoch by the database's clock (PostgreSQL), or this machine's (SQLite)."""
    if conn.dialect.name == "postgresql":
        return float(conn.exec_driver_sql("SELECT extract(epoch from clock_timestamp())").scalar_one())
    return time.time()


# Built once: every write transaction reads the lease (the fencing check), and building the
# statement anew each time cost about as much as running it.
_READ = select(schema.meta.c.value).where(schema.meta.c.key == LEASE_KEY)


def read(conn: Connection) -> Lease | None:
    """The lease row, or None if no head ever claimed this database."""
    value = read_raw(conn)
    return Lease.from_json(value) if value is not None else None


# The same read in SQLite's own SQL, for `read_raw`'s fast path.
_READ_SQLITE = "SELECT value FROM meta WHERE key = ?"


def read_raw(conn: Connection) -> str | None:
    """The lease row's text as stored: a writer that saw the same text last time knows the
    claim is unchanged without parsing it again.

    On SQLite straight through the driver's connection, in the caller's transaction: the
    statement through SQLAlchemy cost ~20 us, this ~2, and it runs at the start of every write
    transaction, each submission's included (issue 18: the head's CPU per job). A driver error
    there reads again through SQLAlchemy, whose error the store maps (a full disk, a locked
    file) as it maps any other."""
    driver = conn.connection.driver_connection if conn.dialect.name == "sqlite" else None
    if driver is not None:
        try:
            row = driver.execute(_READ_SQLITE, (LEASE_KEY,)).fetchone()
        except sqlite3.Error:
            pass
        else:
            return None if row is None else str(row[0])
    value = conn.execute(_READ).scalar()
    return None if value is None else str(value)


def write(conn: Connection, lease: Lease, existed: bool) -> None:
    if existed:
        conn.execute(update(schema.meta).where(schema.meta.c.key == LEASE_KEY).values(value=lease.to_json()))
    else:
        conn.execute(insert(schema.meta).values(key=LEASE_KEY, value=lease.to_json()))


def try_take(
    conn: Connection, holder: Holder, duration_s: float, holds_data_dir: bool
) -> tuple[Lease | None, Lease | None, float]:
    """In a write transaction: take the lease if it is free, expired or its holder is dead.

    Returns (the new lease or None, the row found, the database's time now).
    """
    now = db_now(conn)
    found = read(conn)
    if found is not None and found.expires_at > now and not found.holder.dead(holder, holds_data_dir):
        return None, found, now
    epoch = found.epoch + 1 if found is not None else 1
    lease = Lease(holder, epoch, now + duration_s, now, duration_s)
    write(conn, lease, existed=found is not None)
    return lease, found, now


def lost_message(mine: Lease, found: Lease | None) -> str:
    if found is None:
        now = "nobody holds it (its row is gone)"
    else:
        now = f"{found.holder.describe()} holds it (epoch {found.epoch})"
    return (
        f"this head no longer holds the database's lease (it had epoch {mine.epoch}; {now}): it does not "
        "schedule or change anything; stop it and use the head that holds the lease"
    )
