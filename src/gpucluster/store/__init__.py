"""Durable state of the head: jobs, their state history, and nodes."""

from gpucluster.store.store import AttemptRecord, DataDirUnwritable, JobRecord, NodeRecord, Store, StoreError

__all__ = ["AttemptRecord", "DataDirUnwritable", "JobRecord", "NodeRecord", "Store", "StoreError"]
