"""`gpucluster simulate`: replay a trace through the real scheduler and write a report.

A thin shell over `gpucluster.sim.run.simulate`: options in, a progress bar while it runs, a
comparison table and the paths written out. Bad input prints one message and exits 1.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster.sim.errors import SimInputError, SimulationError
from gpucluster.sim.formats import FORMATS

if TYPE_CHECKING:
    from rich.console import Console


@cache
def _consoles() -> tuple[Console, Console]:
    """(stderr, stdout): rich is imported when `simulate` runs, not by every command (issue 19)."""
    from rich.console import Console

    return (
        Console(stderr=True, highlight=False),
        Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200),
    )


def simulate(
    cluster: Annotated[Path, typer.Option("--cluster", help="cluster spec YAML, e.g. examples/clusters/philly.yaml")],
    trace: Annotated[Path, typer.Option("--trace", help="workload trace file")],
    out: Annotated[Path, typer.Option("--out", help="directory for metrics.json, report.html and plots")],
    fmt: Annotated[
        str | None,
        typer.Option("--format", help=f"trace format: {', '.join(FORMATS)} [default: from the file's header]"),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy", help="policy YAML (as for `gpucluster up`) or fifo, priority, default; repeat to compare"
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed for every random draw (same seed, same metrics)")] = 0,
    strict: Annotated[bool, typer.Option("--strict", help="stop at the first malformed trace row")] = False,
    estimates: Annotated[
        bool,
        typer.Option(
            "--estimates",
            help="at every submit, measure the start estimate a live head would show, with time limits"
            " and with learned run times; metrics.json's start_estimates (slower)",
        ),
    ] = False,
    estimate_every: Annotated[
        int,
        typer.Option("--estimate-every", min=1, help="with --estimates, measure every Nth submit only (cheaper)"),
    ] = 1,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, help="policies simulated at once [default: one per core, up to the number]"),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
) -> None:
    """Replay a workload trace on a simulated cluster through the real scheduler; compare policies."""
    from gpucluster.cli.common import fail
    from gpucluster.sim.run import SimulateOptions
    from gpucluster.sim.run import simulate as run_simulation

    if fmt is not None and fmt not in FORMATS:
        fail(f"--format {fmt!r}: allowed: {', '.join(FORMATS)}")
    opts = SimulateOptions(
        cluster=cluster,
        trace=trace,
        out=out,
        policies=tuple(policy or ("fifo", "priority", "default")),
        fmt=fmt,
        seed=seed,
        strict=strict,
        estimates=estimates,
        estimate_every=estimate_every,
    )
    bar = _Bar(enabled=not quiet and _consoles()[0].is_terminal)
    try:
        with bar:
            outcome = run_simulation(opts, on_phase=bar.phase, on_progress=bar.update, workers=workers)
    except SimInputError as e:
        fail(str(e))
    except SimulationError as e:
        fail(f"the simulation stopped: {e}", code=2)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    _summary(outcome.metrics, outcome.performance, [str(p) for p in outcome.files])


class _Bar:
    """A rich progress bar per policy (jobs done of jobs in the trace, and the simulated day)."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled
        self.progress = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("jobs  day {task.fields[day]:>6.1f}"),
            TimeElapsedColumn(),
            console=_consoles()[0],
            transient=False,
            # Refreshed by `update` (the parent polls its workers every 0.2 s), not by a thread
            # of its own: sim/run.py forks only from a single-threaded process.
            auto_refresh=False,
        )
        self.tasks: dict[str, Any] = {}  # policy -> rich TaskID

    def __enter__(self) -> _Bar:
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()

    def phase(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(f"[dim]{text}[/dim]")

    def update(self, policy: str, done: int, total: int, sim_t: float) -> None:
        if not self.enabled:
            return
        task = self.tasks.get(policy)
        if task is None:
            task = self.tasks[policy] = self.progress.add_task(policy, total=total, day=0.0)
        self.progress.update(task, completed=done, total=total, day=sim_t / 86400.0)
        self.progress.refresh()


def _hours(s: Any) -> str:
    return f"{s / 3600:,.2f}" if isinstance(s, int | float) else "-"


def _summary(metrics: dict[str, Any], perf: dict[str, Any], files: list[str]) -> None:
    from rich.table import Table

    _out = _consoles()[1]
    tr = metrics["inputs"]["trace"]
    _out.print(
        f"{tr['jobs_read']:,} jobs read from {tr['rows']:,} rows"
        + (f" ({tr['malformed_rows']:,} malformed rows skipped; see report.html)" if tr["malformed_rows"] else "")
    )
    table = Table(
        "policy",
        "jobs",
        "skipped",
        "JCT mean h",
        "JCT p99 h",
        "wait mean h",
        "wait p99 h",
        "util",
        "Jain",
        "vs " + (metrics["comparison"][0]["baseline"] if metrics["comparison"] else "-"),
        "wall s",
        box=None,
    )
    table.columns[0].no_wrap = True  # policy names whole, even in a narrow terminal
    table.columns[0].min_width = max(len(r["policy"]) for r in metrics["comparison"]) if metrics["comparison"] else 6
    for row in metrics["comparison"]:
        m = metrics["policies"][row["policy"]]
        ratio = row.get("jct_mean_vs_baseline")
        jain = row["jain_mean_contended"]
        table.add_row(
            row["policy"],
            f"{m['jobs']['simulated']:,}",
            f"{m['jobs']['skipped']:,}",
            _hours(row["jct_mean_s"]),
            _hours(row["jct_p99_s"]),
            _hours(row["queueing_delay_mean_s"]),
            _hours(row["queueing_delay_p99_s"]),
            f"{row['utilisation'] * 100:.1f}%",
            f"{jain:.3f}" if jain is not None else "-",
            f"{ratio:.2f}x" if ratio else "-",
            f"{perf['policies'][row['policy']]['wall_s']:,.1f}",
        )
    _out.print(table)
    if files:
        _out.print("wrote " + ", ".join(files))
