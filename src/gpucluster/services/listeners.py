"""Who listens on a port of this node: the uid of each listening TCP socket, from /proc/net.

Why: the head picks each replica's port, and a port free when picked could be taken by another
member's process before the replica binds it (or after a replica died); the gateway would then
send one team's requests, bodies and all, to another account. A replica is ready only when the
socket on its port belongs to the account its job runs as.
"""

from __future__ import annotations

from pathlib import Path

LISTEN = "0A"
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def listener_uids(port: int, tables: tuple[Path, ...] = _TABLES) -> set[int] | None:
    """The uids of sockets listening on `port` (any address); None if the tables cannot be read."""
    found: set[int] = set()
    read_any = False
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            local_port = int(fields[1].rpartition(":")[2], 16)
            if local_port == port:
                found.add(int(fields[7]))
    return found if read_any else None
