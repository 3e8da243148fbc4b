"""Tables. JSON columns hold values the store never queries by (spec, allocation, launch)."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

# 2: request, wait_reason, estimated_start, stop_message, last_checkpoint_at; team_usage
# 3: not_before, restarts, progress_step, progress_at, checkpoint_step; attempts
SCHEMA_VERSION = 3

metadata = MetaData()

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("team", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("gpus", Float, nullable=False),
    Column("gpu_type", String(64)),
    Column("spec", Text, nullable=False),
    Column("submitted_at", Float, nullable=False),
    Column("started_at", Float),
    Column("ended_at", Float),
    Column("exit_code", Integer),
    Column("reason", Text, nullable=False, default=""),
    Column("attempt", Integer, nullable=False, default=0),
    Column("allocation", Text),
    Column("launch", Text),
    # Why and when the head asked the job to stop (cancel / time limit); durable so the grace
    # period continues across a head restart instead of starting over.
    Column("stop_reason", String(32)),
    Column("stop_requested_at", Float),
    Column("term_sent", Boolean, nullable=False, default=False),
    Column("kill_sent", Boolean, nullable=False, default=False),
    # The scheduler's view of the spec (types, memory, limit, nodes) as compact JSON, so a full
    # reload of the queue never parses whole specs.
    Column("request", Text),
    Column("wait_reason", String(32)),
    Column("estimated_start", Float),
    Column("stop_message", Text),
    Column("last_checkpoint_at", Float),
    Column("queued_at", Float),  # when it last entered the queue (submit or requeue)
    # A restart after a failure waits in the queue until then (backoff).
    Column("not_before", Float),
    Column("restarts", Integer),  # restarts after failures so far; NULL reads as 0
    # The job's own progress reports (gpucluster.train): step, when heard, newest checkpoint.
    Column("progress_step", Integer),
    Column("progress_at", Float),
    Column("checkpoint_step", Integer),
    sqlite_autoincrement=True,
)
Index("ix_jobs_state", jobs.c.state)
Index("ix_jobs_team_state", jobs.c.team, jobs.c.state)

job_events = Table(
    "job_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("at", Float, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False),
)
Index("ix_job_events_job", job_events.c.job_id)

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("virtual", Boolean, nullable=False),
    Column("gpus", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)

team_usage = Table(
    "team_usage",
    metadata,
    Column("team", String(128), primary_key=True),
    Column("gpu_seconds", Float, nullable=False),  # decayed, as of updated_at
    Column("updated_at", Float, nullable=False),
)

# One row per ended attempt of a job (the running one lives in `jobs`), written in the same
# transaction as the state change that ends it.
attempts = Table(
    "attempts",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id"), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("started_at", Float),
    Column("ended_at", Float, nullable=False),
    Column("allocation", Text),
    Column("outcome", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("exit_codes", Text, nullable=False),  # JSON list, one per process; null: lost
    Column("work_lost_s", Float),
)
