"""Trace readers: the shared real traces parse in place; bad rows are reported by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucluster.core.types import Dependency, DependencyKind, Priority
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.readers import detect_format, read_trace
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import cluster_yaml

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is not here")


@pytest.fixture
def spec(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_cluster_spec(
        cluster_yaml(tmp_path / "c.yaml", nodes=4, gpus=8, extra="trace_fill: {priority: {high: 1, low: 1}}\n")
    )


@needs_traces
def test_real_philly_trace(spec) -> None:  # type: ignore[no-untyped-def]
    path = TRACES / "philly" / "philly-2017-09-to-11.csv"
    assert detect_format(path) == "philly"
    t = read_trace(path, spec, seed=1)
    assert (t.rows, len(t.jobs), t.error_count) == (74167, 74167, 0)
    assert t.jobs[0].submit == 0.0 and [j.job_id for j in t.jobs[:3]] == [1, 2, 3]
    assert len({j.team for j in t.jobs}) == 15
    assert max(j.gpus for j in t.jobs) == 32
    assert t.jobs[-1].submit == pytest.approx((87 * 24 + 13) * 3600 + 21 * 60 + 30)  # 09-04 10:30:41 .. 11-30 23:52:11
    assert {j.priority for j in t.jobs} == {Priority.HIGH, Priority.LOW}  # filled from the spec's mix


@needs_traces
def test_real_pollux_and_tiresias_traces(spec) -> None:  # type: ignore[no-untyped-def]
    pollux = read_trace(TRACES / "pollux" / "workloads" / "workload-1.csv", spec, seed=1)
    assert pollux.format == "pollux" and len(pollux.jobs) == 160 and pollux.error_count == 0
    cifar = [j for j in pollux.jobs if j.name.startswith("cifar10")]
    assert all(60 <= j.duration * j.gpus <= 3600 for j in cifar)  # < 1 GPU-hour, as Pollux drew them
    again = read_trace(TRACES / "pollux" / "workloads" / "workload-1.csv", spec, seed=1)
    other = read_trace(TRACES / "pollux" / "workloads" / "workload-1.csv", spec, seed=2)
    assert [j.duration for j in again.jobs] == [j.duration for j in pollux.jobs]
    assert [j.duration for j in other.jobs] != [j.duration for j in pollux.jobs]
    tiresias = read_trace(TRACES / "tiresias" / "60_job.csv", spec, seed=1)
    assert tiresias.format == "tiresias" and len(tiresias.jobs) == 60
    assert tiresias.jobs[0].name == "vgg19-0" and tiresias.jobs[0].duration == 164 and tiresias.jobs[1].gpus == 8


PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
BAD_PHILLY = (
    PHILLY_HEADER
    + "2017-10-01 00:00:00,100.0,1,100.0,vision\n"  # line 2: fine
    + "yesterday,100.0,1,100.0,vision\n"  # line 3
    + "2017-10-01 00:01:00,100.0,zero,0,vision\n"  # line 4
    + "2017-10-01 00:02:00,100.0\n"  # line 5
    + "2017-10-01 00:03:00,-5,1,0,nlp\n"  # line 6
    + "2017-10-01 00:04:00,60,2,120,nlp\n"  # line 7: fine
    + "2017-10-01 00:05:00,60,1.5,90,nlp\n"  # line 8
)


def test_malformed_rows_are_reported_with_their_line(tmp_path: Path, spec) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.csv"
    p.write_text(BAD_PHILLY)
    t = read_trace(p, spec, seed=0)
    assert (t.rows, len(t.jobs), t.error_count) == (7, 2, 5)
    lines = {e.line: e.message for e in t.errors}
    assert sorted(lines) == [3, 4, 5, 6, 8]
    assert "timestamp" in lines[3] and "num_gpus" in lines[4] and "fields" in lines[5]
    assert "duration" in lines[6] and "whole number" in lines[8]
    assert [(j.line, j.team, j.gpus) for j in t.jobs] == [(2, "vision", 1), (7, "nlp", 2)]


def test_strict_stops_at_the_first_bad_row(tmp_path: Path, spec) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.csv"
    p.write_text(BAD_PHILLY)
    with pytest.raises(SimInputError) as e:
        read_trace(p, spec, seed=0, strict=True)
    assert str(e.value).startswith(f"{p}:3: timestamp")


def test_native_csv_takes_every_field_the_head_accepts(tmp_path: Path, spec) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "n.csv"
    p.write_text(
        "submit_time,duration,gpus,gpu_type,name,team,priority,time_limit,command,env,workdir,shell,"
        "gpu_memory,min_gpu_memory,nodes,checkpoint_interval\n"
        '10,2h,16,H100-80GB,big,vision,high,4h,python train.py --x 1,"{""A"": ""1""}",/w,false,,,2,30m\n'
        '0,90,0.25,"[""H100-80GB"", ""A100""]",small,nlp,low,,,,,,20GiB,,,none\n'
    )
    t = read_trace(p, spec, seed=0)
    assert t.error_count == 0, t.errors
    small, big = t.jobs
    assert (big.job_id, big.submit, big.duration, big.gpus, big.nodes) == (2, 10.0, 7200.0, 16, 2)
    assert (big.team, big.priority, big.time_limit, big.checkpoint, big.gpu_types) == (
        "vision",
        Priority.HIGH,
        14400.0,
        1800.0,
        ("H100-80GB",),
    )
    assert (small.gpus, small.gpu_types, small.gpu_memory_mb, small.checkpoint) == (
        0.25,
        ("H100-80GB", "A100"),
        20480,
        None,
    )


def test_native_jsonl_and_its_errors(tmp_path: Path, spec) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "n.jsonl"
    rows = [
        {"submit_time": 0, "duration": 60, "gpus": 2, "team": "a"},
        {"submit_time": 1, "duration": 60, "gpus": 0},
        "not json",
        {"submit_time": 2, "duration": 60, "colour": "red"},
        {"submit_time": 3, "duration": 60, "priority": "urgent"},
        [1, 2],
        {"duration": 60},
    ]
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    assert detect_format(p) == "native"
    t = read_trace(p, spec, seed=0)
    assert len(t.jobs) == 1 and t.jobs[0].team == "a"
    lines = {e.line: e.message for e in t.errors}
    assert sorted(lines) == [2, 3, 4, 5, 6, 7]
    assert "gpus" in lines[2]
    assert "not valid JSON" in lines[3]
    assert "unknown field(s) colour" in lines[4]
    assert "priority" in lines[5]
    assert "JSON object" in lines[6]
    assert "submit_time is missing" in lines[7]


def test_unknown_header_asks_for_format(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(SimInputError, match=r"x.csv:1: cannot tell the trace format.*--format"):
        detect_format(p)


def test_empty_trace_and_missing_file(tmp_path: Path, spec) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "e.csv"
    p.write_text(PHILLY_HEADER)
    assert read_trace(p, spec, seed=0).jobs == []
    with pytest.raises(SimInputError, match="cannot read trace"):
        read_trace(tmp_path / "missing.csv", spec, seed=0, fmt="philly")


def test_native_arrays_expand_to_elements_and_dependencies_name_trace_ids(tmp_path: Path, spec) -> None:  # type: ignore[no-untyped-def]
    """An array row takes one job id per element (its array id is the first's, as on the head);
    `afterok: [7]` names the row whose `id` is 7, which may be an array (then: all of it)."""
    p = tmp_path / "n.jsonl"
    rows = [
        {"id": 7, "submit_time": 0, "duration": 60, "array": "0-4:2%2"},
        {"id": 8, "submit_time": 0, "duration": 60, "array": "0-4:2", "aftercorr": 7},
        {"submit_time": 5, "duration": 60, "afterok": [7], "after": [8]},
        {"submit_time": 6, "duration": 60, "afterok": [99]},  # no such row
        {"id": 9, "submit_time": 7, "duration": 60, "afterany": [10]},  # 10 comes later: refused
        {"id": 10, "submit_time": 8, "duration": 60, "hold": True, "release_time": 3},
        {"id": 7, "submit_time": 9, "duration": 60},  # id 7 again
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = read_trace(p, spec, seed=0)
    assert {e.line: e.message for e in t.errors} == {
        4: "afterok: no row submitted before this one has id 99",
        5: "afterany: no row submitted before this one has id 10",
        6: "release_time 3 is before submit_time: a job is released after it is submitted",
        7: "id 7 is already used by an earlier row",
    }
    shape = [(j.job_id, j.array_id, j.array_index, j.throttle) for j in t.jobs]
    assert shape == [
        (1, 1, 0, 2),
        (2, 1, 2, 2),
        (3, 1, 4, 2),
        (4, 4, 0, None),
        (5, 4, 2, None),
        (6, 4, 4, None),
        (7, None, None, None),
    ]
    assert t.jobs[3].after == (Dependency(DependencyKind.AFTEROK, 1),)  # aftercorr: element 0 of array 1
    assert t.jobs[5].after == (Dependency(DependencyKind.AFTEROK, 3),)
    assert set(t.jobs[6].after) == {
        Dependency(DependencyKind.AFTEROK, 1, array=True),
        Dependency(DependencyKind.AFTER, 4, array=True),
    }


def test_native_csv_dependency_cells_and_a_sweep(tmp_path: Path, spec) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "n.csv"
    p.write_text(
        "id,submit_time,duration,sweep,throttle,afterok\n"
        '1,0,60,"{""lr"": [0.1, 0.01], ""b"": [1, 2]}",2,\n'
        '2,1,60,,,"1"\n'
        "3,2,60,,,1 2\n"
        "4,3,60,,,one\n"
    )
    t = read_trace(p, spec, seed=0)
    assert {e.line: e.message for e in t.errors} == {
        5: "afterok: give the trace ids of earlier rows, e.g. 3 or \"3,4\"; got 'one'"
    }
    assert [(j.array_id, j.throttle) for j in t.jobs[:4]] == [(1, 2)] * 4
    assert t.jobs[4].after == (Dependency(DependencyKind.AFTEROK, 1, array=True),)
    assert t.jobs[5].after == (Dependency(DependencyKind.AFTEROK, 1, array=True), Dependency(DependencyKind.AFTEROK, 5))
