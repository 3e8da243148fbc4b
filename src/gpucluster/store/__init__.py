"""Durable state of the head: jobs, their state history, and nodes."""

from gpucluster.store.store import AttemptRecord, JobRecord, NodeRecord, Store, StoreError

__all__ = ["AttemptRecord", "JobRecord", "NodeRecord", "Store", "StoreError"]
