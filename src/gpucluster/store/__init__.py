"""Durable state of the head: jobs, their state history, and nodes."""

from gpucluster.store.store import JobRecord, NodeRecord, Store, StoreError

__all__ = ["JobRecord", "NodeRecord", "Store", "StoreError"]
