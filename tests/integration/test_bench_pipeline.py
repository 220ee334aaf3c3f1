"""`triage bench pipeline` on the real broker with real processes: a small run prints
every figure with consistent ratios, and no run leaves a child behind, whether it
ends normally, on a failed start, or killed by SIGINT, SIGTERM or SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from triage.bench.children import BenchStartError
from triage.bench.leftovers import sweep
from triage.bench.pipeline import RATIOS, run
from triage.kafka.clients import make_admin

FIELDS = ("completed_per_s", "decisions_per_s", "p50_ms", "p99_ms", "warmup_p99_ms",
          "admission_cpu_us_per_request", "admission_cpu_s_per_1000_requests",
          "paced_cpu_us_per_request",
          "broker_produce_per_s", "broker_consume_per_s", "faust_relay_ceiling_per_s",
          "faust_table_ceiling_per_s", "faust_skeleton_ceiling_per_s",
          "faust_relay_cpu_us_per_msg", "faust_table_cpu_us_per_msg",
          "faust_skeleton_cpu_us_per_request", "faust_matched_skeleton_ceiling_per_s",
          "faust_matched_skeleton_cpu_us_per_request")
SMALL = ["--repetitions", "1", "--latency-rate", "200", "--latency-requests", "200",
         "--warmup-requests", "50",
         "--burst-requests", "300", "--broker-messages", "2000", "--ceiling-messages", "300"]


def processes_naming(text: str, but: int | None = None) -> list[int]:
    """Pids of live processes whose command line mentions `text` (the run's folder),
    other than this one and `but`."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in (os.getpid(), but):
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def _bench(out: Path, bootstrap: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "triage", "bench", "pipeline", "--json", "-b", bootstrap,
         "--out", str(out), *SMALL, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_a_small_run_reports_every_figure_with_consistent_ratios(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    proc = _bench(tmp_path, kafka_bootstrap)
    stdout, stderr = proc.communicate(timeout=540)
    assert proc.returncode == 0, stderr[-3000:]
    res = json.loads(stdout)
    for key in FIELDS:
        assert isinstance(res[key], float) and res[key] > 0, (key, res[key])
    assert res["p99_ms"] >= res["p50_ms"]
    for name, num, den in RATIOS:
        assert res[name] > 0, name
        assert res[name] == pytest.approx(res[num] / res[den], rel=0.01), name
    assert res["broker_per_s"] == min(res["broker_produce_per_s"], res["broker_consume_per_s"])
    assert res["admission_cpu_s_per_1000_requests"] == pytest.approx(
        res["admission_cpu_us_per_request"] / 1000, rel=0.01)
    (rep,) = res["per_repetition"]
    assert rep["burst_completed"] == rep["burst_decided"] == 300, rep
    assert 0.0 <= rep["burst_queued_share"] <= 1.0
    assert rep["matched_items_per_message"] >= 1.0  # the batcher sent every work item back
    assert rep["latency_decided"] == 200
    assert res["warmup_requests"] == 50
    latency = json.loads((Path(res["run_dir"]) / "r1" / "latency.json").read_text())
    assert len(latency) == 200  # (produce ms, latency ms) of each latency-phase request
    assert max(ms for _, ms in latency) == rep["max_ms"]
    assert res["instances"] == 1 and res["pools"] == 1
    assert processes_naming(res["run_dir"]) == []


def test_a_failed_start_leaves_no_child_running(kafka_bootstrap: str, tmp_path: Path) -> None:
    # the admission app refuses two partitions at start; the workers are already up
    with pytest.raises(BenchStartError, match="admission-0 did not start"):
        run(bootstrap=kafka_bootstrap, out_dir=tmp_path, repetitions=1, latency_requests=100,
            warmup_requests=0, burst_requests=100, broker_messages=100, ceiling_messages=100,
            overrides={"kafka": {"request_partitions": 2}})
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "r1" / "worker-g0.log").exists(), "the workers were started"
    assert "request_partitions" in (run_dir / "r1" / "admission-0.log").read_text()
    assert processes_naming(str(run_dir)) == []


def _wait_for_children(proc: subprocess.Popen[str], run_dir: Path) -> list[int]:
    """The bench's admission app and two workers, once all three run."""
    deadline = time.monotonic() + 120
    children: list[int] = []
    while len(children) < 3 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        children = processes_naming(str(run_dir), but=proc.pid)
        time.sleep(0.2)
    assert len(children) >= 3, "the bench never started its children"
    return children


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_killed_bench_stops_its_children(
    kafka_bootstrap: str, tmp_path: Path, sig: signal.Signals
) -> None:
    proc = _bench(tmp_path, kafka_bootstrap)
    try:
        _wait_for_children(proc, tmp_path)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "every child process was stopped" in stderr
    assert processes_naming(str(tmp_path)) == []


def test_a_bench_killed_with_sigkill_takes_its_children_along(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """SIGKILL runs no cleanup in the bench: each child stops itself (SIGTERM from the
    kernel when its parent dies, triage/lifeline.py), and none is left running."""
    proc = _bench(tmp_path, kafka_bootstrap)
    try:
        children = _wait_for_children(proc, tmp_path)
        proc.kill()
        proc.communicate(timeout=30)
        left = children
        deadline = time.monotonic() + 60  # each child's own graceful stop
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = processes_naming(str(tmp_path))
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in processes_naming(str(tmp_path)):  # never leave one behind, even failing
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert left == [], f"children still running after the bench was killed: {left}"
    # its topics stay on the broker, until the next run on the same --out sweeps them
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    deleted = sweep(kafka_bootstrap, tmp_path)
    assert deleted and all(t.startswith(run_dir.name) for t in deleted)
    remaining = make_admin(kafka_bootstrap).list_topics(timeout=10).topics
    assert not [t for t in remaining if t.startswith(run_dir.name)]
