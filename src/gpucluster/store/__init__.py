"""Durable state of the head: jobs, their state history, and nodes."""

from gpucluster.store.store import (
    AttemptRecord,
    DatabaseUnavailable,
    DataDirUnwritable,
    JobRecord,
    LeaseHeld,
    LeaseLost,
    NodeRecord,
    QueueLimitReached,
    Store,
    StoreError,
)

__all__ = [
    "AttemptRecord",
    "DataDirUnwritable",
    "DatabaseUnavailable",
    "JobRecord",
    "LeaseHeld",
    "LeaseLost",
    "NodeRecord",
    "QueueLimitReached",
    "Store",
    "StoreError",
]
