"""`triage bench handlers`: the pipeline's flat-out pattern through the service alone.
Counts, not times: every request completes, most queue first, and the outputs per
request are those of the queued path (7) and the immediate one (5) mixed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from triage.bench.handlers import run
from triage.cli.main import app


def test_every_request_completes_and_most_queue_first() -> None:
    out = run(requests=1200, tenants=3)
    assert out["completed"] == 1200
    assert 600 <= out["queued_first"] < 1200  # two GPUs run 512 at once
    share = out["queued_first"] / 1200
    assert abs(out["outputs_per_request"] - (5 + 2 * share)) < 0.05
    assert out["completion_messages"] == 120  # ten to a message
    assert out["cpu_us_per_request"] > 0


def test_the_command_prints_one_json_object() -> None:
    res = CliRunner().invoke(app, ["bench", "handlers", "--json", "--requests", "300",
                                   "--prompt-bytes", "2000"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["completed"] == 300 and out["prompt_bytes"] == 2000
