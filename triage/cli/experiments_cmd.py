"""`triage experiments`: rerun the seed's claims and print ours beside its figures.

    triage experiments                      # all of them, full size (minutes)
    triage experiments queue buffer --scale 0.1
    triage experiments --json --out reports/experiments -j 2

--out writes results.json and each experiment's scenarios as YAML, which
`triage sim FILE.yaml` reruns with the experiment's policies.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from triage.cli.common import ExitCode, fail
from triage.experiments import EXPERIMENTS
from triage.experiments.base import ExperimentResult

err = Console(stderr=True)


def _table(results: list[ExperimentResult]) -> Table:
    scale = ", ".join(sorted({f"{r.scale:g}" for r in results}))
    t = Table(title=f"The seed's claims, rerun (scale {scale})", show_lines=True)
    for col in ("experiment", "claim", "seed's figure", "our figure", "direction holds"):
        t.add_column(col, overflow="fold")
    for r in results:
        t.add_row(
            r.name, r.claim, r.seed_figure, r.our_figure,
            "[green]yes[/green]" if r.holds else "[red]no[/red]",
        )
    return t


def write_out(results: list[ExperimentResult], out: Path) -> list[Path]:
    """results.json plus every scenario as YAML under out/scenarios/."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json"]
    (out / "results.json").write_text(
        json.dumps([r.to_dict() for r in results], indent=1, default=str) + "\n",
        encoding="utf-8",
    )
    for r in results:
        for name, spec in r.specs.items():
            path = out / "scenarios" / f"{name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                f"# scenario of experiment {r.name!r} at scale {r.scale:g}; rerun with\n"
                f"#   triage sim {path}\n" + yaml.safe_dump(spec, sort_keys=False),
                encoding="utf-8",
            )
            written.append(path)
    return written


def experiments(
    names: list[str] | None = typer.Argument(
        None, help=f"Experiments to run (default: all): {', '.join(EXPERIMENTS)}."
    ),
    scale: float = typer.Option(
        1.0, "--scale", help="Fraction of each experiment's full size (CI: 0.05-0.15)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    out: Path | None = typer.Option(
        None, "--out", help="Write results.json and the scenarios (YAML) here."
    ),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Simulations run in parallel."),
    check: bool = typer.Option(
        False, "--check", help="Exit 1 if any experiment's direction does not hold."
    ),
    list_only: bool = typer.Option(False, "--list", help="List the experiments and exit."),
) -> None:
    """Rerun the seed article's claims in the simulator and compare with its figures."""
    if list_only:
        for e in EXPERIMENTS.values():
            typer.echo(f"{e.name:10s} {e.claim} (seed: {e.seed_figure})")
        return
    chosen = names or list(EXPERIMENTS)
    unknown = [n for n in chosen if n not in EXPERIMENTS]
    if unknown:
        raise fail(f"unknown {', '.join(unknown)}; known: {', '.join(EXPERIMENTS)}",
                   ExitCode.USAGE, json_out=json_out)  # fmt: skip
    if scale <= 0:
        raise fail("--scale must be positive", ExitCode.USAGE, json_out=json_out)
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # one line per run is noise here
        logging.getLogger("triage.sim.compare").setLevel(logging.WARNING)
    results: list[ExperimentResult] = []
    for name in chosen:
        with err.status(f"{name} (scale {scale:g})"):
            res = EXPERIMENTS[name].run(scale=scale, jobs=jobs)
        err.print(f"{name}: {res.wall_s:.1f} s")
        results.append(res)
    if out is not None:
        written = write_out(results, out)
        err.print(f"wrote {written[0]} and {len(written) - 1} scenario files")
    if json_out:
        payload: list[dict[str, Any]] = [r.to_dict() for r in results]
        sys.stdout.write(json.dumps(payload, indent=1, default=str) + "\n")
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)
        console.print(_table(results))
        for r in results:
            console.print(f"[bold]{r.name}[/bold]: {r.direction}")
            for note in r.notes:
                console.print(f"  - {note}")
    if check and not all(r.holds for r in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Attach `triage experiments` to the root app."""
    app.command("experiments")(experiments)
