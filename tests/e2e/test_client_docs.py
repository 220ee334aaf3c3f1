"""docs/client.md runs as written: every ```python block of the page, in order, against
the real broker, the admission app and two sim workers, with the shipped example config
saved as triage.yaml in the working directory (its own topic prefix and ports)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import yaml
from harness import running

from triage.config import load_config
from triage.ports import free_port, free_run
from triage.topics.admin import create_topics, delete_topics
from triage.topics.names import TopicNames

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text())


def test_the_page_has_the_examples_it_promises() -> None:
    code = "\n".join(blocks())
    for name in ("InferenceRequest(", ".submit(", "submit_with_retry", "on_update=",
                 ".stream(", "run_batch(", "asubmit(", "astream("):
        assert name in code, name


def test_every_example_runs(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = TopicNames(f"t{uuid.uuid4().hex[:8]}")
    base = load_config()  # the shipped example, as the page says
    data = base.model_dump(mode="json")
    data["kafka"].update(bootstrap_servers=kafka_bootstrap, topic_prefix=names.prefix)
    data["metrics"].update(admission_port=free_port(), worker_port_base=free_run(2))
    data["admission"]["datadir"] = str(tmp_path / "admission-data")
    data["worker"].update(sim_time_scale=0.1, heartbeat_s=0.5)  # quick in wall time
    (tmp_path / "triage.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "triage.yaml")
    create_topics(kafka_bootstrap, names, cfg)
    monkeypatch.chdir(tmp_path)
    try:
        with running(cfg, tmp_path):
            for i, code in enumerate(blocks()):
                exec(compile(code, f"docs/client.md block {i + 1}", "exec"), {})
    finally:
        delete_topics(kafka_bootstrap, names.prefix)
    out = capsys.readouterr().out
    assert "completed" in out and "of 20 completed" in out
