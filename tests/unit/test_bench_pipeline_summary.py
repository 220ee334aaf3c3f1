"""The pipeline bench's arithmetic and options, without a broker: medians over the
repetitions, ratios between the medians, the pools' config, the refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from triage.bench.batcher import batch_bytes
from triage.bench.ceiling_app import QueuedShare
from triage.bench.children import Fleet, cpu_seconds
from triage.bench.pipeline import bench_config, instances_problem, summarize
from triage.cli.common import ExitCode
from triage.cli.main import app
from triage.demo.processes import ChildProcess

runner = CliRunner()


def _rep(scale: float) -> dict[str, float]:
    return {"completed_per_s": 300 * scale, "decisions_per_s": 500 * scale, "p50_ms": 10.0,
            "p99_ms": 90 * scale, "admission_cpu_us_per_request": 2000 * scale,
            "broker_produce_per_s": 180_000 * scale, "broker_consume_per_s": 120_000.0,
            "faust_relay_ceiling_per_s": 3000 * scale, "faust_relay_cpu_us_per_msg": 300.0,
            "faust_table_ceiling_per_s": 1500 * scale, "faust_table_cpu_us_per_msg": 600.0,
            "faust_skeleton_ceiling_per_s": 600 * scale,
            "faust_skeleton_cpu_us_per_request": 1600.0}


def test_figures_are_medians_and_ratios_are_between_the_medians() -> None:
    out = summarize([_rep(1.0), _rep(3.0), _rep(0.5)])  # medians: the scale-1 repetition
    assert out["completed_per_s"] == 300 and out["faust_skeleton_ceiling_per_s"] == 600
    assert out["broker_per_s"] == 120_000  # the slower of produce and consume
    assert out["triage_vs_skeleton"] == 0.5
    assert out["skeleton_vs_table"] == 0.4
    assert out["table_vs_relay"] == 0.5
    assert out["relay_vs_broker"] == 0.025
    assert out["triage_cpu_vs_skeleton"] == 1.25
    assert out["admission_cpu_s_per_1000_requests"] == 2.0


def test_a_missing_figure_gives_no_ratio_rather_than_a_wrong_one() -> None:
    rep = {**_rep(1.0), "admission_cpu_us_per_request": None}
    out = summarize([rep])
    assert out["admission_cpu_us_per_request"] is None
    assert out["triage_cpu_vs_skeleton"] is None
    assert out["admission_cpu_s_per_1000_requests"] is None
    assert out["triage_vs_skeleton"] == 0.5


@pytest.mark.parametrize("share", [0.0, 0.25, 0.944, 1.0])
def test_the_matched_skeleton_queues_its_share_of_every_prefix(share: float) -> None:
    queued = QueuedShare(share)
    taken = 0
    for n in range(1, 2001):
        taken += queued.next()
        assert abs(taken - share * n) <= 1.0, (n, taken)
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        QueuedShare(1.5)


def test_a_batch_of_work_items_is_one_json_list_of_them() -> None:
    items = [b'{"request_id": "a"}', b'{"request_id": "b", "n": [1]}']
    assert json.loads(batch_bytes(items)) == [{"request_id": "a"}, {"request_id": "b", "n": [1]}]


def test_tenants_are_as_many_as_asked_each_with_its_topic(tmp_path: Path) -> None:
    cfg = bench_config("127.0.0.1:1", "b", tmp_path, gpus=2, tenants=1000)
    assert len({t.name for t in cfg.tenants}) == 1000


def test_pools_split_the_gpus_and_each_has_a_model(tmp_path: Path) -> None:
    cfg = bench_config("127.0.0.1:1", "b", tmp_path, gpus=5, pools=2)
    assert [p.gpus for p in cfg.pools] == [["g0", "g2", "g4"], ["g1", "g3"]]
    assert {m.name: m.pool for m in cfg.models} == {"tiny0": "p0", "tiny1": "p1"}
    other = bench_config("127.0.0.1:1", "b", tmp_path, gpus=5, pools=2)
    assert cfg.metrics.admission_port != other.metrics.admission_port or \
        cfg.metrics.worker_port_base != other.metrics.worker_port_base  # picked at run time
    with pytest.raises(ValueError, match="fewer than --pools"):
        bench_config("127.0.0.1:1", "b", tmp_path, gpus=1, pools=2)


@pytest.mark.parametrize("args,needle", [
    (["--instances", "2"], "needs at least as many --pools"),
    (["--pools", "2", "--gpus", "2", "--shards", "3"], "more than --pools"),
    (["--gpus", "1", "--pools", "2"], "fewer than --pools"),
    (["--tenants", "0"], "--tenants"),
])  # fmt: skip
def test_options_it_cannot_run_are_one_line_and_exit_2(args: list[str], needle: str,
                                                       tmp_path: Path) -> None:
    res = runner.invoke(app, ["bench", "pipeline", "--json", "--out", str(tmp_path), *args])
    assert res.exit_code == ExitCode.USAGE, res.output
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert json.loads(res.stdout)["code"] == ExitCode.USAGE
    assert not any(tmp_path.iterdir()), "nothing started, nothing written"
    assert instances_problem(1) is None and instances_problem(2, pools=2) is None


def test_a_sharded_bench_puts_each_pool_on_its_own_partition(tmp_path: Path) -> None:
    cfg = bench_config("127.0.0.1:1", "b", tmp_path, gpus=4, pools=4, shards=2)
    assert [p.partition for p in cfg.pools] == [0, 1, 0, 1]
    assert cfg.kafka.admission_partitions == cfg.kafka.request_partitions == 2


def test_fleet_stops_every_child_and_counts_their_cpu(tmp_path: Path) -> None:
    fleet = Fleet()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
           "time.sleep(600)"
    children = [ChildProcess(f"c{i}", [], tmp_path / f"c{i}.log") for i in range(2)]
    for c in children:  # plain python children, not `python -m triage`
        fleet.children.append(c)
        c.proc = subprocess.Popen([sys.executable, "-c", busy], start_new_session=True)
    deadline = time.monotonic() + 30
    pids = fleet.pids()
    while min(cpu_seconds(p) for p in pids) < 0.3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert min(cpu_seconds(p) for p in pids) >= 0.29
    fleet.stop_all(timeout_s=5)
    assert fleet.children == []
    for c in children:  # stopped and reaped
        assert c.proc is not None and c.proc.returncode == -15
        assert not Path(f"/proc/{c.proc.pid}").exists()


def test_the_text_report_names_every_ceiling_and_the_ratios() -> None:
    from triage.cli.bench_cmd import _pipeline_lines

    res = {**summarize([_rep(1.0)]), "repetitions": 1, "run_dir": "r",
           "latency_offered_per_s": 500.0, "tenants": 1000, "pools": 4}
    text = "\n".join(_pipeline_lines(res))
    for needle in ("produce 180,000/s", "consume 120,000/s", "relay     3,000 msgs/s",
                   "table     1,500 msgs/s", "skeleton  600 requests/s", "300 completed/s",
                   "2,000 us admission CPU", "(2 s per 1,000)", "triage/skeleton 0.5",
                   "relay/broker 0.025", "1000 tenants, 4 pool(s)"):
        assert needle in text, (needle, text)
