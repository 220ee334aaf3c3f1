"""The documented start order from a fresh checkout: `triage topics create -c C` then
`triage admission -c C`, with a datadir whose parents do not exist yet, on the real
broker; the app comes up ready and stops cleanly on SIGTERM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from triage.cli.main import app
from triage.config import EXAMPLE_CONFIG
from triage.demo.processes import ChildProcess, wait_for_metric
from triage.ports import free_port
from triage.topics.names import TopicNames


def test_topics_create_then_admission_with_a_fresh_datadir(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    port = free_port()
    data["kafka"] = {**data.get("kafka", {}), "bootstrap_servers": kafka_bootstrap,
                     "topic_prefix": topic_names.prefix}  # fmt: skip
    data["metrics"] = {**data.get("metrics", {}), "admission_port": port}
    datadir = tmp_path / "clone" / "var" / "admission"  # like var/admission in a fresh clone
    data["admission"] = {**data.get("admission", {}), "datadir": str(datadir)}
    cfg = tmp_path / "triage.yaml"
    cfg.write_text(yaml.safe_dump(data))

    created = CliRunner().invoke(app, ["topics", "create", "-c", str(cfg)])
    assert created.exit_code == 0, created.output
    assert not datadir.parent.exists()

    proc = ChildProcess("admission", ["admission", "-c", str(cfg), "--loglevel", "warn"],
                        tmp_path / "admission.log")  # fmt: skip
    proc.start()
    try:
        ready = wait_for_metric(f"http://127.0.0.1:{port}/metrics", "triage_admission_ready 1.0",
                                timeout_s=180, proc=proc)  # fmt: skip
        assert ready, proc.tail(60)
        assert datadir.is_dir()
    finally:
        code = proc.stop()
    assert code == 0, proc.tail(40)
    log = (tmp_path / "admission.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "%3|" not in log


def test_admission_refuses_topics_with_another_partition_count_in_one_line(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    """Kafka keeps a topic's partition count: an unsharded deployment's topics (1
    partition) under a config of 2 shards would leave shard 1 without a partition: the
    app started and sat there (this test timed out before the check). It refuses to
    start, exit 2, naming a topic, before it reads or writes anything."""
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["kafka"] = {**data.get("kafka", {}), "bootstrap_servers": kafka_bootstrap,
                     "topic_prefix": topic_names.prefix}  # fmt: skip
    data["metrics"] = {**data.get("metrics", {}), "admission_port": free_port()}
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump(data))
    created = CliRunner().invoke(app, ["topics", "create", "-c", str(one)])
    assert created.exit_code == 0, created.output

    data["kafka"] = {**data["kafka"], "admission_partitions": 2, "request_partitions": 2}
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(data))
    done = subprocess.run(
        [sys.executable, "-m", "triage", "admission", "-c", str(two),
         "--datadir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert f"topic {topic_names.prefix}." in said, said
    assert "has 1 partition" in said and "kafka.admission_partitions is 2" in said, said
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())
