"""Tables. JSON columns hold values the store never queries by (spec, allocation, launch)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
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

# The schema's version: the number of the newest Alembic revision (store/migrations/versions,
# named 0001, 0002, ...), also kept in `meta.schema` so that a gpucluster from before Alembic
# refuses a database it does not know. A change to these tables needs a new revision there.
# 1: jobs, job_events, nodes
# 2: request, wait_reason, estimated_start, stop_message, last_checkpoint_at, queued_at; team_usage
# 3: not_before, restarts, progress_step, progress_at, checkpoint_step; attempts
# 4: jobs.owner; users, memberships, tokens, audit; telemetry, presence and accounting tables
# 5: attempts.cpu_s, attempts.memory_peak_bytes
# 6: job_metrics
# 7: attempts.pull_s
# 8: jobs.held, jobs.array_id, jobs.array_index; arrays
# 9: jobs.kind (batch | session); job_usage.kind, job_usage.idle_gpu_seconds
# 10: services, service_replicas
# 11: jobs.failed_rank
# 12: node_states.until
# 13: nodes.labels
# 14: jobs.priority: critical 3 -> 4 (serving is 3)
# 15: service_jobs
# 16: nodes.cpus, nodes.memory_mb
SCHEMA_VERSION = 16
HEAD_REVISION = f"{SCHEMA_VERSION:04d}"

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
    Column("owner", String(128)),  # the user who submitted it; NULL for jobs from before identities
    # Held by its user (submit --hold, gpucluster hold): never started until released. NULL: not held.
    Column("held", Boolean),
    # An array's element: the array (the id of its first element) and the element's index.
    Column("array_id", Integer),
    Column("array_index", Integer),
    Column("kind", String(16)),  # batch | session (interactive); NULL reads as batch
    # Which process of a distributed attempt failed first (with stop_reason "failure"), so the
    # attempt's end names it, not one of the others killed after it.
    Column("failed_rank", Integer),
    sqlite_autoincrement=True,
)
Index("ix_jobs_state", jobs.c.state)
Index("ix_jobs_array", jobs.c.array_id, jobs.c.array_index)

# One row per job array (issue 20); its id is its first element's job id, so a job id names the
# array the way Slurm's does. The elements are ordinary jobs rows sharing one spec text.
arrays = Table(
    "arrays",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("count", Integer, nullable=False),
    Column("throttle", Integer),  # at most this many elements run at once; NULL: no limit
    Column("sweep", Text),  # the sweep's parameters as JSON (core/arrays.Sweep), for each element's values
    Column("created_at", Float, nullable=False),
)
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
    Column("labels", Text),  # JSON list of labels (ib, rack=r1) jobs select it by; NULL: none
    # CPU cores and host memory (MiB) jobs may ask for (--cpus, --mem); NULL: not accounted.
    Column("cpus", Float),
    Column("memory_mb", BigInteger),
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
    # From the attempt's cgroups (executors/cgroups.py): CPU seconds of all its processes, and the
    # sum over its processes' cgroups of each one's peak memory; null where the node had none.
    Column("cpu_s", Float),
    Column("memory_peak_bytes", BigInteger),
    Column("pull_s", Float),  # a container job's image pull, the longest of its processes'; null: none
)
# The accountant looks for attempts that ended since its last step every few seconds.
Index("ix_attempts_ended_at", attempts.c.ended_at)

# What a training script reports (gpucluster.train.report: loss, accuracy, tokens/s), one row per
# metric per report (reports come at most every few seconds), per attempt: charts and `show`.
job_metrics = Table(
    "job_metrics",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("name", String(64), nullable=False),
    Column("step", BigInteger),
    Column("at", Float, nullable=False),
    Column("value", Float, nullable=False),
)
Index("ix_job_metrics_job", job_metrics.c.job_id, job_metrics.c.attempt)

# ---- identity and access (store/access.py) ---------------------------------------------------

users = Table(
    "users",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("cluster_admin", Boolean, nullable=False, default=False),
    # The Unix account a root head runs this user's jobs as; NULL: the user's own name.
    Column("unix_user", String(64)),
    Column("created_at", Float, nullable=False),
)

memberships = Table(
    "memberships",
    metadata,
    Column("user", String(128), ForeignKey("users.name"), primary_key=True),
    Column("team", String(128), primary_key=True),
    Column("role", String(16), nullable=False),  # member | team-admin
    Column("position", Integer, nullable=False, default=0),  # the lowest is the default team
)

# Only the SHA-256 of a token is kept: a copy of the database gives no one a usable token.
tokens = Table(
    "tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user", String(128), ForeignKey("users.name"), nullable=False),
    Column("sha256", String(64), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float),
    Column("revoked_at", Float),
    Column("note", String(256), nullable=False, default=""),
    sqlite_autoincrement=True,
)
Index("ix_tokens_user", tokens.c.user)

# Who changed what, and when. Submissions are not copied here: a job's owner and submitted_at
# say the same, durably, without a second write on the hot path (the audit view joins them in).
audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("user", String(128), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(256), nullable=False, default=""),
    Column("detail", Text, nullable=False, default=""),
    sqlite_autoincrement=True,
)
Index("ix_audit_at", audit.c.at)

# ---- telemetry and health (issue 7) -----------------------------------------------------------

# GPU samples, downsampled with age (gpucluster.store.telemetry): level 0 raw, 1 one-minute
# means, 2 one-hour means. A row covers [at, at + seconds): energy = power_w * seconds, and means
# are weighted by `seconds`. `jobs` names the jobs holding the GPU then (",3,7,"; "" when free),
# and rows of different holders are never merged, so a job's samples stay its own.
gpu_samples = Table(
    "gpu_samples",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(255), nullable=False),
    Column("gpu", Integer, nullable=False),
    Column("level", Integer, nullable=False),
    Column("at", Float, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("jobs", String(255), nullable=False),
    Column("utilization", Float),  # percent
    Column("memory_used_mb", Float),
    Column("temperature_c", Float),
    Column("power_w", Float),
    Column("sm_clock_mhz", Float),
    Column("memory_clock_mhz", Float),
)
Index("ix_gpu_samples_level_at", gpu_samples.c.level, gpu_samples.c.at)
Index("ix_gpu_samples_node_gpu_at", gpu_samples.c.node, gpu_samples.c.gpu, gpu_samples.c.at)

# A drained node gets no new jobs; its running jobs continue. `source`: user or health.
node_states = Table(
    "node_states",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("drained", Boolean, nullable=False),
    Column("reason", Text, nullable=False),
    Column("source", String(16), nullable=False),
    Column("since", Float, nullable=False),
    Column("until", Float),  # a drain's planned end (drain --until): it ends by itself then; NULL: none
)

# Why telemetry found a GPU unhealthy (a row per unhealthy GPU; gpu -1: the whole node). `kind`:
# ecc, xid, temperature, silent; ecc and xid stay until an undrain, the others clear by themselves.
gpu_health = Table(
    "gpu_health",
    metadata,
    Column("node", String(255), primary_key=True),
    Column("gpu", Integer, primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("problem", Text, nullable=False),
    Column("since", Float, nullable=False),
)

# Facts telemetry found about a running job (flag "idle": its GPUs sat unused since `since`).
job_flags = Table(
    "job_flags",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id"), primary_key=True),
    Column("flag", String(16), primary_key=True),
    Column("since", Float, nullable=False),
    Column("message", Text, nullable=False),
)

# ---- node presence (issue 6, store/presence.py): nodes that join and leave (Ray) -------------

# A node the head learnt from a distributed engine: where it is, which incarnation (a Ray node
# id: a node that rejoins gets a new one) and whether it is up. A node without a row is up.
node_presence = Table(
    "node_presence",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("address", String(255), nullable=False),
    Column("incarnation", String(128), nullable=False),
    Column("up", Boolean, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("since", Float, nullable=False),
)

# ---- accounting (issue 7, store/accounting.py): GPU time, money and energy per job attempt ----

# One row per attempt, accrued every few seconds while it runs (`accrued_until`) and made final
# (`final`) when it ends, so a head that dies loses at most the last few seconds. GPU-seconds and
# cost grow linearly over [started_at, accrued_until], so a window's part of a row is its share
# of that interval. Energy and utilisation come from telemetry samples as they are stored.
job_usage = Table(
    "job_usage",
    metadata,
    Column("job_id", Integer, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("team", String(128), nullable=False),
    Column("owner", String(128)),
    Column("gpu_model", String(255), nullable=False),
    Column("gpus", Float, nullable=False),  # GPUs held, a fraction for a share of one
    Column("allocation", Text),
    Column("started_at", Float, nullable=False),
    Column("accrued_until", Float, nullable=False),
    Column("gpu_seconds", Float, nullable=False, default=0.0),
    Column("cost", Float, nullable=False, default=0.0),
    Column("energy_j", Float, nullable=False, default=0.0),
    Column("used_gpu_seconds", Float, nullable=False, default=0.0),  # utilisation x seconds x share
    Column("sampled_gpu_seconds", Float, nullable=False, default=0.0),  # seconds x share with a reading
    Column("kind", String(16)),  # the job's: batch | session; NULL reads as batch
    Column("idle_gpu_seconds", Float),  # seconds x share with a reading at or under IDLE_UTILIZATION
    Column("final", Boolean, nullable=False, default=False),
    Column("outcome", String(16)),
    Column("work_lost_s", Float),
)
Index("ix_job_usage_until", job_usage.c.accrued_until)
Index("ix_job_usage_team_until", job_usage.c.team, job_usage.c.accrued_until)


# A service (services/): its spec as JSON, its state, and the revision a rolling update moves to.
services = Table(
    "services",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("team", String(128), nullable=False),
    Column("owner", String(128)),
    Column("spec", Text, nullable=False),
    Column("state", String(16), nullable=False),  # running, failed, deleting
    Column("reason", Text, nullable=False, default=""),
    Column("revision", Integer, nullable=False, default=1),
    Column("created_at", Float, nullable=False),
    Column("ready_once", Boolean, nullable=False, default=False),  # some replica answered its probe
)

# One row per replica: written before its job is submitted (job_id NULL until then), so a head
# that dies in between finds the job by its name (`<service>.r<id>`) instead of starting another.
service_replicas = Table(
    "service_replicas",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("service", String(128), ForeignKey("services.name"), nullable=False),
    Column("job_id", Integer),
    Column("port", Integer, nullable=False),
    Column("revision", Integer, nullable=False),
    Column("draining_since", Float),
)
Index("ix_service_replicas_service", service_replicas.c.service)

# Every job that was ever one of a service's replicas, kept while the service exists (replica
# rows go when a replica is replaced): what the service has cost in GPU-hours, money and energy
# is the sum of these jobs' usage (issue 23).
service_jobs = Table(
    "service_jobs",
    metadata,
    Column("service", String(128), ForeignKey("services.name"), primary_key=True),
    Column("job_id", Integer, primary_key=True),
)
