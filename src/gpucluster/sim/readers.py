"""Trace readers: philly, pollux, tiresias, alibaba2023 and the native CSV/JSONL, into TraceJobs.

Every row that cannot be used is reported with its line number and why; with `strict` the first
one stops the read (SimInputError naming file:line). Jobs get ids 1..N in submission order (ties
in file order) and times relative to the first submission. Formats are described in README.md
in this folder; `detect_format` tells them apart by their header.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpucluster.core.types import Dependency, DependencyKind, Priority
from gpucluster.durations import parse_duration
from gpucluster.errors import GpuclusterError
from gpucluster.models import MAX_GPUS_PER_JOB, JobSpec
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.fill import Filler, FillError
from gpucluster.sim.formats import FORMATS
from gpucluster.sim.spec import ClusterSpec
from gpucluster.sim.workload import RawJob, RowGates, Trace, TraceJob

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval")
# Alibaba's cluster-trace-gpu-v2023 pod lists (openb_pod_list_*.csv; the FGD paper, USENIX ATC '23).
ALIBABA_COLUMNS = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
    "creation_time", "deletion_time", "scheduled_time",
)  # fmt: skip
# The simulator's own fields; the rest of a native row is what `POST /v1/jobs` accepts (JobSpec).
# `id`: the row's own id in the trace, which other rows' dependencies (after, afterok, ...) name.
# `release_time`: with `hold: true`, when its user released it (`gpucluster release`), in the
# time base of `submit_time`; without one a held job is never released.
NATIVE_SIM_FIELDS = ("submit_time", "duration", "checkpoint_interval", "user", "id", "release_time")
NATIVE_FIELDS = NATIVE_SIM_FIELDS + tuple(JobSpec.model_fields)
MAX_DURATION_S = 10 * 365 * 86400.0
DEPENDENCY_FIELDS = ("after", "afterok", "afternotok", "afterany")


class RowError(ValueError, GpuclusterError):
    """One row is unusable; the message says which field and what is allowed."""


def detect_format(path: Path) -> str:
    """The format named by the file's first line (a CSV header, or a JSON object for native)."""
    try:
        with path.open(newline="") as f:
            first = f.readline()
    except OSError as e:
        raise SimInputError(f"{path}: cannot read trace: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SimInputError(f"{path}: not a text file") from None
    if first.lstrip().startswith("{"):
        return "native"
    header = tuple(c.strip() for c in next(csv.reader([first]), []))
    if header[: len(PHILLY_COLUMNS)] == PHILLY_COLUMNS:
        return "philly"
    if header[: len(POLLUX_COLUMNS)] == POLLUX_COLUMNS:
        return "pollux"
    if header[: len(TIRESIAS_COLUMNS)] == TIRESIAS_COLUMNS:
        return "tiresias"
    if header[: len(ALIBABA_COLUMNS)] == ALIBABA_COLUMNS:
        return "alibaba2023"
    if "submit_time" in header and "duration" in header:
        return "native"
    raise SimInputError(
        f"{path}:1: cannot tell the trace format from this header ({first.strip()[:120]!r}); "
        f"pass --format ({', '.join(FORMATS)}); README.md in gpucluster/sim describes each"
    )


def read_trace(path: Path, spec: ClusterSpec, seed: int, fmt: str | None = None, strict: bool = False) -> Trace:
    """Parse, fill and number every job of `path`."""
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise SimInputError(f"unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")
    trace = Trace(path=str(path), format=fmt)
    filler = Filler(spec, seed)
    rows = _ROW_READERS[fmt]
    jobs: list[TraceJob] = []
    try:
        with path.open(newline="") as f:
            for line, item in rows(path, f):
                trace.rows += 1
                try:
                    if isinstance(item, RowError):
                        raise item
                    jobs.append(filler.fill(item))
                except (RowError, FillError) as e:
                    if strict:
                        raise SimInputError(f"{path}:{line}: {e} (--strict stops at the first bad row)") from None
                    trace.add_error(line, str(e))
    except OSError as e:
        raise SimInputError(f"{path}: cannot read trace: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SimInputError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    except csv.Error as e:
        raise SimInputError(f"{path}: not a readable CSV file: {e}") from None
    jobs.sort(key=lambda j: (j.submit, j.line))
    t0 = jobs[0].submit if jobs else 0.0
    trace.jobs = _number_jobs(path, trace, jobs, t0, strict)
    return trace


def _number_jobs(path: Path, trace: Trace, jobs: list[TraceJob], t0: float, strict: bool) -> list[TraceJob]:
    """Number the jobs 1..N in submission order, as the head would: an array row takes one id per
    element (its array id is the first's), and dependencies name rows by their trace `id`, which
    become job ids here. A dependency must name a row submitted before its own (an earlier time,
    or the same time and an earlier line), as on the head, where it must already exist: so no
    cycle can form and a target always has the smaller id. A row naming an id that no earlier
    usable row has is refused (and so, in turn, are rows that depend on it)."""
    out: list[TraceJob] = []
    known: dict[int, tuple[int, bool, dict[int, int]]] = {}  # trace id -> job id, is array, index -> job id
    for j in jobs:
        g = j.gates
        if g is None:
            out.append(j._replace(job_id=len(out) + 1, submit=j.submit - t0))
            continue
        try:
            after = _resolve(g, known)
        except RowError as e:
            if strict:
                raise SimInputError(f"{path}:{j.line}: {e} (--strict stops at the first bad row)") from None
            trace.add_error(j.line, str(e))
            continue
        first = len(out) + 1
        hold = g.hold_until - t0 if g.hold_until is not None else None
        base = j._replace(submit=j.submit - t0, gates=None, after=after, hold_until=hold)
        if g.indices is None:
            out.append(base._replace(job_id=first))
            by_index: dict[int, int] = {}
        else:
            corr = known[g.corr][2] if g.corr is not None else {}
            by_index = {}
            for k, index in enumerate(g.indices):
                pair = (Dependency(DependencyKind.AFTEROK, corr[index]),) if index in corr else ()
                by_index[index] = first + k
                out.append(
                    base._replace(
                        job_id=first + k, array_id=first, array_index=index, throttle=g.throttle, after=after + pair
                    )
                )
        if g.trace_id is not None:
            known[g.trace_id] = (first, g.indices is not None, by_index)
    return out


def _resolve(g: RowGates, known: dict[int, tuple[int, bool, dict[int, int]]]) -> tuple[Dependency, ...]:
    if g.trace_id is not None and g.trace_id in known:
        raise RowError(f"id {g.trace_id} is already used by an earlier row")
    deps: list[Dependency] = []
    for kind, tid in g.after:
        if tid not in known:
            raise RowError(f"{kind}: no row submitted before this one has id {tid}")
        job_id, is_array, _ = known[tid]
        deps.append(Dependency(DependencyKind(kind), job_id, is_array))
    if g.corr is not None and not (g.corr in known and known[g.corr][1]):
        raise RowError(f"aftercorr: no array row submitted before this one has id {g.corr}")
    return tuple(deps)


Rows = Iterator[tuple[int, RawJob | RowError]]


def _csv_rows(path: Path, f: Any, expected: tuple[str, ...], parse: Callable[[int, dict[str, str]], RawJob]) -> Rows:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        return
    header = [h.strip() for h in header]
    missing = [c for c in expected if c not in header]
    if missing:
        raise SimInputError(f"{path}:1: the header lacks column(s) {', '.join(missing)}; it has {', '.join(header)}")
    width = len(header)
    for row in reader:
        line = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        if len(row) != width:
            yield line, RowError(f"has {len(row)} fields; the header has {width}")
            continue
        try:
            yield line, parse(line, dict(zip(header, row, strict=True)))
        except RowError as e:
            yield line, e


# ---- field parsers: one message per kind of mistake ---------------------------------------


def _number(row: dict[str, Any], key: str, minimum: float = 0.0, maximum: float = math.inf) -> float:
    text = row.get(key)
    if text is None or (isinstance(text, str) and not text.strip()):
        raise RowError(f"{key} is missing")
    if isinstance(text, bool):
        raise RowError(f"{key} must be a number, not {text!r}")
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise RowError(f"{key} must be a number; got {text!r}") from None
    if not math.isfinite(v) or v < minimum or v > maximum:
        raise RowError(f"{key} must be between {minimum:g} and {maximum:g}; got {text!r}")
    return v


def _gpus(row: dict[str, Any], key: str) -> int:
    v = _number(row, key, 0, MAX_GPUS_PER_JOB)
    if v < 1 or not v.is_integer():
        raise RowError(f"{key} must be a whole number of GPUs from 1 to {MAX_GPUS_PER_JOB}; got {row[key]!r}")
    return int(v)


def _seconds(row: dict[str, Any], key: str) -> float:
    text = row.get(key)
    if isinstance(text, str) and text.strip() and not _is_number(text):
        try:
            v = parse_duration(text)
        except ValueError as e:
            raise RowError(f"{key}: {e}") from None
        if v > MAX_DURATION_S:
            raise RowError(f"{key} must be at most 10 years; got {text!r}")
        return v
    return _number(row, key, 0.0, MAX_DURATION_S)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---- philly -------------------------------------------------------------------------------


def _philly(path: Path, f: Any) -> Rows:
    def parse(line: int, row: dict[str, str]) -> RawJob:
        stamp = row["timestamp"].strip()
        try:
            submit = datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise RowError(f"timestamp must look like 2017-10-03 14:05:09; got {stamp!r}") from None
        team = row["cluster"].strip() or None
        return RawJob(
            line=line,
            submit=submit,
            gpus=_gpus(row, "num_gpus"),
            duration=_number(row, "duration", 0.0, MAX_DURATION_S),
            team=team,
            user=(row.get("user") or "").strip() or None,  # optional: Philly's job log names users
        )

    return _csv_rows(path, f, PHILLY_COLUMNS, parse)


# ---- pollux -------------------------------------------------------------------------------


def _pollux(path: Path, f: Any) -> Rows:
    def parse(line: int, row: dict[str, str]) -> RawJob:
        return RawJob(
            line=line,
            submit=_number(row, "time", 0.0, MAX_DURATION_S),
            gpus=_gpus(row, "num_replicas"),
            name=row["name"].strip() or None,
            application=row["application"].strip(),
        )

    return _csv_rows(path, f, POLLUX_COLUMNS, parse)


# ---- tiresias -----------------------------------------------------------------------------


def _tiresias(path: Path, f: Any) -> Rows:
    def parse(line: int, row: dict[str, str]) -> RawJob:
        model = row["model_name"].strip() or "job"
        return RawJob(
            line=line,
            submit=_number(row, "submit_time", 0.0, MAX_DURATION_S),
            gpus=_gpus(row, "num_gpu"),
            duration=_number(row, "duration", 0.0, MAX_DURATION_S),
            name=f"{model}-{row['job_id'].strip()}",
        )

    return _csv_rows(path, f, TIRESIAS_COLUMNS, parse)


# ---- alibaba2023 --------------------------------------------------------------------------


def _alibaba2023(path: Path, f: Any) -> Rows:
    """Alibaba's GPU-sharing cluster, 2023: one pod per row, with what it asked for.

    - `num_gpu` whole GPUs; a pod of one GPU with `gpu_milli` under 1000 asks for that share of
      one GPU (460 -> 0.46), the GPU sharing the trace is about;
    - `cpu_milli` / `memory_mib`: its CPUs (in thousandths) and host memory, so the replay is held
      to each node's CPUs and memory as the cluster was;
    - `gpu_spec`: GPU models it may use (`V100M16|V100M32`; empty: any), named as the node list's
      `model` column (examples/clusters/alibaba2023.yaml uses those names);
    - `qos` (LS, BE, Burstable, Guaranteed) is the team, so per-team figures split by it;
    - run time: `deletion_time - scheduled_time`, or from `creation_time` for a pod never
      scheduled there (Pending, then deleted: it is replayed as asking for the time it waited).
    CPU-only pods (`num_gpu` 0) are CPU-only jobs (gpus 0): placed by their CPUs and memory
    alone, on any node (`Capacity.place_host_only`), and counted apart in the metrics (the
    CPU-only bucket) so GPU figures are not diluted; one asking for neither is refused."""

    def parse(line: int, row: dict[str, str]) -> RawJob:
        whole = _number(row, "num_gpu", 0, MAX_GPUS_PER_JOB)
        if not whole.is_integer():
            raise RowError(f"num_gpu must be a whole number of GPUs; got {row['num_gpu']!r}")
        cpus = _number(row, "cpu_milli", 0, 1e9) / 1000
        mem_mb = int(_number(row, "memory_mib", 0, 1e12))
        if whole == 0 and not cpus and not mem_mb:
            raise RowError("num_gpu is 0 and it asks for no CPU (cpu_milli) or memory (memory_mib): nothing to place")
        milli = _number(row, "gpu_milli", 0, 1000)
        gpus = milli / 1000 if whole == 1 and 0 < milli < 1000 else whole
        created = _number(row, "creation_time", 0.0, MAX_DURATION_S)
        ended = _number(row, "deletion_time", 0.0, MAX_DURATION_S)
        scheduled = _number(row, "scheduled_time", 0.0, MAX_DURATION_S) if row["scheduled_time"].strip() else None
        began = scheduled if scheduled is not None else created
        if ended < began:
            raise RowError(f"deletion_time {row['deletion_time']} is before the pod started ({began:g})")
        models = row["gpu_spec"].strip()
        return RawJob(
            line=line,
            submit=created,
            gpus=gpus,
            duration=ended - began,
            team=row["qos"].strip() or None,
            gpu_types=tuple(m.strip() for m in models.split("|") if m.strip())
            if whole and models and models != "nan"
            else (),
            name=row["name"].strip() or None,
            cpus=cpus,
            mem_mb=mem_mb,
        )

    return _csv_rows(path, f, ALIBABA_COLUMNS, parse)


# ---- native -------------------------------------------------------------------------------


def native_job(row: dict[str, Any]) -> RawJob:
    """One native record (from CSV text or JSON) -> RawJob; the JobSpec part is validated by
    the same model the live head's API uses, so a row the head would refuse is refused here."""
    unknown = sorted(k for k in row if k not in NATIVE_FIELDS)
    if unknown:
        raise RowError(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(NATIVE_FIELDS)}")
    fields = {k: v for k, v in row.items() if k not in NATIVE_SIM_FIELDS and v is not None and v != ""}
    for k in DEPENDENCY_FIELDS:
        if isinstance(fields.get(k), str | int):
            fields[k] = _id_list(k, str(fields[k]))
    if isinstance(fields.get("sweep"), str):
        try:
            fields["sweep"] = json.loads(fields["sweep"])
        except json.JSONDecodeError:
            raise RowError('sweep must be a JSON object, e.g. {"lr": [0.1, 0.01]}') from None
    if isinstance(fields.get("command"), str):
        fields["command"] = [fields["command"]] if _truthy(fields.get("shell")) else shlex.split(fields["command"])
    if isinstance(fields.get("env"), str):
        try:
            fields["env"] = json.loads(fields["env"])
        except json.JSONDecodeError:
            raise RowError('env must be a JSON object, e.g. {"K": "V"}') from None
    if isinstance(fields.get("gpu_type"), str) and fields["gpu_type"].lstrip().startswith("["):
        try:
            fields["gpu_type"] = json.loads(fields["gpu_type"])
        except json.JSONDecodeError:
            raise RowError('gpu_type: a list of models is a JSON list, e.g. ["H100-80GB", "A100-80GB"]') from None
    fields.setdefault("command", ["true"])
    try:
        spec = JobSpec.model_validate(fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "job"
        raise RowError(f"{where}: {str(first['msg']).removeprefix('Value error, ')}") from None
    ckpt: Any = "spec"
    raw_ckpt = row.get("checkpoint_interval")
    if raw_ckpt is not None and raw_ckpt != "":
        text = str(raw_ckpt).strip().lower()
        if text in ("none", "never", "off"):
            ckpt = None
        elif text in ("young", "daly"):
            ckpt = text
        else:
            ckpt = _seconds(row, "checkpoint_interval")
            if ckpt <= 0:
                raise RowError("checkpoint_interval must be above 0, or none, young or daly")
    tl = spec.time_limit
    return RawJob(
        line=0,
        submit=_seconds(row, "submit_time"),
        gpus=spec.gpu_count,
        duration=_seconds(row, "duration"),
        team=spec.team if "team" in fields else None,
        priority=Priority.parse(spec.priority) if "priority" in fields else None,
        gpu_types=spec.gpu_types if "gpu_type" in fields else None,
        name=spec.name,
        time_limit=float(tl) if isinstance(tl, int | float) else None,
        checkpoint=ckpt,
        gpu_memory_mb=spec.gpu_memory_mb,
        min_gpu_memory_mb=spec.min_gpu_memory_mb,
        nodes=spec.nodes,
        min_gpus=spec.min_gpus,
        max_restarts=spec.max_restarts if "max_restarts" in fields else None,
        user=_user(row.get("user")),
        selection=spec.selection,
        gates=_gates(row, spec),
        cpus=spec.cpus,
        mem_mb=spec.mem_mb,
    )


def _id_list(key: str, text: str) -> list[int]:
    """A CSV cell's ids: `3`, `3,4` (quoted in CSV), `3 4` or `3;4`."""
    parts = [p for p in re.split(r"[,;\s]+", text.strip()) if p]
    if not all(p.isdigit() for p in parts):
        raise RowError(f'{key}: give the trace ids of earlier rows, e.g. 3 or "3,4"; got {text!r}')
    return [int(p) for p in parts]


def _gates(row: dict[str, Any], spec: JobSpec) -> RowGates | None:
    """The row's array and dependencies, or None for a plain job (the common case: no cost)."""
    raw_id = row.get("id")
    trace_id: int | None = None
    if raw_id is not None and raw_id != "":
        text = str(raw_id).strip()
        if isinstance(raw_id, bool) or not text.isdigit():
            raise RowError(f"id must be a whole number (the row's id, which dependencies name); got {raw_id!r}")
        trace_id = int(text)
    shape = spec.array_spec
    after = tuple((k, i) for k in DEPENDENCY_FIELDS for i in getattr(spec, k))
    hold = _hold_until(row, spec)
    if trace_id is None and shape is None and not after and hold is None:
        return None
    return RowGates(
        trace_id=trace_id,
        indices=shape.indices if shape is not None else None,
        throttle=shape.throttle if shape is not None else None,
        after=after,
        corr=spec.aftercorr,
        hold_until=hold,
    )


def _hold_until(row: dict[str, Any], spec: JobSpec) -> float | None:
    """`hold: true` -> when its user released it (`release_time`, in the time base of
    `submit_time`), inf when the trace says it never was; None: not held. An array row's hold
    holds every element, as `submit --hold --array` does."""
    raw = row.get("release_time")
    given = raw is not None and raw != ""
    if not spec.hold:
        if given:
            raise RowError("release_time: only a held job (hold: true) is released")
        return None
    if not given:
        return math.inf
    release = _seconds(row, "release_time")
    if release < _seconds(row, "submit_time"):
        raise RowError(f"release_time {raw!r} is before submit_time: a job is released after it is submitted")
    return release


def _user(v: Any) -> str | None:
    """A native row's `user` (who submitted it, for per-user limits); None when it names none."""
    if v is None or v == "":
        return None
    if not isinstance(v, str) or len(v.strip()) > 128:
        raise RowError(f"user must be a user name (at most 128 characters); got {v!r}")
    return v.strip() or None


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))


def _native(path: Path, f: Any) -> Rows:
    first = f.readline()
    f.seek(0)
    if first.lstrip().startswith("{"):
        return _jsonl(f)

    def parse(line: int, row: dict[str, str]) -> RawJob:
        return native_job(row)._replace(line=line)

    return _csv_rows(path, f, ("submit_time", "duration"), parse)


def _jsonl(f: Any) -> Rows:
    for line, text in enumerate(f, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            yield line, RowError(f"not valid JSON: {e.msg} at column {e.colno}")
            continue
        if not isinstance(obj, dict):
            yield line, RowError(f"each line must be a JSON object; got {type(obj).__name__}")
            continue
        try:
            yield line, native_job(obj)._replace(line=line)
        except RowError as e:
            yield line, e


_ROW_READERS: dict[str, Callable[[Path, Any], Rows]] = {
    "philly": _philly,
    "pollux": _pollux,
    "tiresias": _tiresias,
    "alibaba2023": _alibaba2023,
    "native": _native,
}
