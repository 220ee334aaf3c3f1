"""triage replay without Kafka: record decisions with the simulator, export them as the
decisions topic holds them, replay the export under the same and other policies."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.unit._core_factory import config, tenant
from triage.admission.core import AdmissionCore
from triage.admission.decision import Decision
from triage.admission.pending import Pending
from triage.cli.main import app
from triage.config.models import TriageConfig
from triage.replay import (
    ReplayReport,
    compare,
    read_export,
    replay,
    write_export,
)
from triage.replay.export_file import NO_SHAPE
from triage.replay.recording import Recording
from triage.sim.engine import SimOptions, Simulator
from triage.sim.policies import policy_config
from triage.sim.workload import Arrival
from triage.streams import codec
from triage.topics.messages import DecisionRecord
from triage.topics.reasons import Outcome, ReasonCode

DURATION_S = 30


def overloaded() -> TriageConfig:
    """Tenant `a` sends about twice its token quota; `b` has room; two small GPUs."""
    return config(
        tenants=[
            tenant("a", rate_tokens_per_s=3000, burst_tokens=6000, sla_ms=20_000,
                   max_queue_wait_ms=5000),
            tenant("b", sla_ms=20_000, max_queue_wait_ms=5000),
        ],
        gpus=2, kv_budget_gib=1.0,
    )


def arrivals(seed: int = 7) -> list[Arrival]:
    """Arrivals on a 1/8 s grid: exact in milliseconds and in binary, so the export's
    integer at_ms gives the replay the very times the recording had (the first at 0, so
    virtual time starts where the recording's did)."""
    rng = random.Random(seed)
    out = []
    for k in range(DURATION_S * 8):
        t = k / 8
        if rng.random() < 0.6 or k == 0:
            out.append(Arrival(t, "a", "m8", rng.randint(600, 1500), 256, rng.randint(1, 256),
                               None, f"a-{k}"))
        if rng.random() < 0.3:
            out.append(Arrival(t, "b", "m8", rng.randint(200, 2000), 512, rng.randint(1, 512),
                               None, f"b-{k}"))
    return out


def record(cfg: TriageConfig, arrs: list[Arrival]) -> list[bytes]:
    """Run the simulator as the app would have, and write each decision as the app does:
    the decision made at a request's arrival carries its shape."""
    batches: list[list[Decision]] = []
    Simulator(cfg, arrs, options=SimOptions(), on_decisions=lambda ds, now: batches.append(ds)
              ).run()
    by_id = {a.request_id: a for a in arrs}
    seen: set[str] = set()
    lines = []
    for batch in batches:  # encoded after the run: a batch may grow after the probe sees it
        for d in batch:
            arrival = None
            if d.request_id not in seen:
                seen.add(d.request_id)
                a = by_id[d.request_id]
                assert a.request_id is not None
                arrival = Pending(a.request_id, a.tenant, a.model, "p", a.prompt_tokens,
                                  a.max_tokens, a.t, 20.0)
            lines.append(codec.decision_record(d, arrival))
    return lines


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "decisions.jsonl"
    path.write_bytes(b"\n".join(record(overloaded(), arrivals())) + b"\n")
    return path


def run(path: Path, policy: str | None = None, cfg: TriageConfig | None = None,
        **kw: int) -> ReplayReport:
    cfg = cfg or overloaded()
    rec = read_export(path, since_ms=kw.get("since_ms"), until_ms=kw.get("until_ms"))
    pol = policy_config(policy, base=cfg.policy) if policy else None
    return compare(rec, replay(rec, cfg, pol), examples=2)


def test_the_codec_records_the_shape_at_arrival_and_what_a_completion_generated() -> None:
    cfg = config(gpus=1)
    core = AdmissionCore(cfg)
    p = Pending("r1", "a", "m8", "p", 300, 200, 0.0, 60.0)
    [d] = core.submit("r1", "a", "m8", 300, 200, 0.0)
    rec = DecisionRecord.from_bytes(codec.decision_record(d, p))
    assert (rec.inputs.prompt_tokens, rec.inputs.max_tokens) == (300, 200)
    bare = DecisionRecord.from_bytes(codec.decision_record(d))
    assert bare.inputs.prompt_tokens is None and bare.inputs.max_tokens is None
    other = Pending("r2", "a", "m8", "p", 1, 1, 0.0, 60.0)  # another request's shape: not used
    assert DecisionRecord.from_bytes(codec.decision_record(d, other)).inputs.max_tokens is None
    [done] = core.complete(pool="p", request_id="r1", attempt=0, ok=True, output_tokens=17,
                           prefill_s=0.1, decode_s=0.2, concurrency=1.0, now=1.0)
    assert DecisionRecord.from_bytes(codec.decision_record(done)).inputs.output_tokens == 17


def test_the_same_policy_replays_every_decision_unchanged(export: Path) -> None:
    report = run(export)
    n = len(arrivals())
    assert (report.requests, report.compared, report.simulated) == (n, n, n)
    assert report.first_changed == report.outcome_changed == report.final_changed == 0
    assert report.transitions == [] and report.final_transitions == []
    assert report.recorded_policies == {"full v1": n}
    # the recording has every kind of answer, so "unchanged" means something
    finals = {k for t in report.tenants for k in t.recorded_finals}
    assert {"completed", "rejected"} <= finals
    assert report.output_tokens.recorded > 0


def test_replay_is_deterministic(export: Path) -> None:
    assert run(export, "admit_all").to_json() == run(export, "admit_all").to_json()


def test_admit_all_turns_quota_rejections_into_accepts(export: Path) -> None:
    report = run(export, "admit_all")
    assert report.policy == "admit_all"
    assert report.first_changed > 0
    assert report.outcome_transitions.get("reject -> accept", 0) > 0
    assert all(k.endswith("-> accept") for k in report.outcome_transitions)  # never stricter
    by_tenant = {t.tenant: t for t in report.tenants}
    assert by_tenant["a"].outcome_changed > 0
    quota = next(
        t for t in report.transitions
        if (t.recorded, t.replayed) == ("reject:tenant_quota_exceeded", "accept:admitted")
    )
    assert quota.tenants.get("a", 0) == quota.count > 0
    assert 0 < len(quota.examples) <= 2
    ex = quota.examples[0]
    assert ex.recorded.reason is ReasonCode.TENANT_QUOTA_EXCEEDED
    assert ex.replayed.outcome is Outcome.ACCEPT
    assert "bucket_level" in ex.recorded.numbers and "request_tokens" in ex.recorded.numbers
    assert "kv_bytes_needed" in ex.replayed.numbers and ex.replayed.numbers.get("gpu_id")
    assert ex.recorded.sentence.startswith("Rejected") and ex.replayed.sentence.startswith(
        "Accepted")
    assert ex.replayed.at_ms == ex.recorded.at_ms == ex.arrived_ms
    assert any(f.recorded == "rejected" for f in report.final_transitions)


def test_a_time_range_selects_requests_by_their_first_decision(export: Path) -> None:
    report = run(export, since_ms=10_000, until_ms=19_999)
    in_range = [a for a in arrivals() if 10.0 <= a.t < 20.0]
    assert report.requests == len(in_range)
    empty = read_export(export, since_ms=DURATION_S * 1000 + 60_000)
    assert empty.requests == [] and empty.scanned > 0


def test_records_without_the_request_shape_are_left_out_and_said(tmp_path: Path,
                                                                 export: Path) -> None:
    old = tmp_path / "old.jsonl"
    with old.open("w") as out:
        for line in export.read_text().splitlines():
            data = json.loads(line)
            data["inputs"].pop("prompt_tokens", None)
            data["inputs"].pop("max_tokens", None)
            out.write(json.dumps(data) + "\n")
    rec = read_export(old)
    assert rec.requests == []
    assert rec.skipped[NO_SHAPE] == len(arrivals())


def test_a_saved_recording_replays_as_the_original(tmp_path: Path, export: Path) -> None:
    rec = read_export(export)
    saved = tmp_path / "saved.jsonl"
    with saved.open("wb") as out:
        lines = write_export(rec, out)
    assert len(arrivals()) <= lines < 2 * len(arrivals()) + 1
    again = run(saved)
    assert again.first_changed == again.final_changed == 0
    assert again.requests == len(arrivals())
    assert run(saved, "admit_all").transitions == run(export, "admit_all").transitions


def test_requests_the_candidate_config_cannot_serve_are_invalid(export: Path) -> None:
    only_a = config(
        tenants=[tenant("a", rate_tokens_per_s=3000, burst_tokens=6000, sla_ms=20_000,
                        max_queue_wait_ms=5000)],
        gpus=2, kv_budget_gib=1.0,
    )
    report = run(export, cfg=only_a)
    b = next(t for t in report.tenants if t.tenant == "b")
    assert b.outcome_changed == b.compared > 0
    assert b.replayed_finals == {"invalid": b.requests}
    assert any(t.replayed == "invalid:unknown_tenant" for t in report.transitions)


def test_empty_recording_replays_nothing() -> None:
    rec = Recording(source="nothing", since_ms=None, until_ms=None)
    report = compare(rec, replay(rec, overloaded()))
    assert report.requests == 0 and report.tenants == []


# --- the CLI -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay-cfg") / "candidate.yaml"
    path.write_text(yaml.safe_dump(overloaded().model_dump(mode="json")))
    return path


def test_cli_json(export: Path, config_file: Path) -> None:
    res = CliRunner().invoke(app, ["replay", "-c", str(config_file), "--file", str(export),
                                   "--policy", "admit_all", "--examples", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["policy"] == "admit_all" and data["requests"] == len(arrivals())
    assert data["outcome_transitions"]["reject -> accept"] > 0
    assert all(len(t["examples"]) <= 1 for t in data["transitions"])
    assert ReplayReport.model_validate(data).first_changed == data["first_changed"]


def test_cli_table(export: Path, config_file: Path) -> None:
    res = CliRunner().invoke(app, ["replay", "-c", str(config_file), "-f", str(export),
                                   "-p", "full+variance_buffer=1.0"])
    assert res.exit_code == 0, res.output
    assert "under full+variance_buffer=1.0" in res.stdout
    assert "per tenant" in res.stdout


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--policy", "bogus"], 2, "unknown policy"),
    (["--since", "yesterday-ish"], 2, "--since"),
    (["--since", "2000", "--until", "1000"], 2, "after --until"),
    (["--since", "1h"], 1, "nothing to replay"),  # the recording is at 1970
])
def test_cli_errors(export: Path, config_file: Path, args: list[str], code: int,
                    says: str) -> None:
    res = CliRunner().invoke(app, ["replay", "-c", str(config_file), "-f", str(export), *args])
    assert res.exit_code == code, res.output
    assert says in " ".join(res.output.split())


def test_cli_unreadable_file(tmp_path: Path, config_file: Path) -> None:
    res = CliRunner().invoke(app, ["replay", "-c", str(config_file), "-f",
                                   str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 3
    assert "cannot read" in " ".join(res.output.split())
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n")
    res = CliRunner().invoke(app, ["replay", "-c", str(config_file), "-f", str(junk)])
    assert res.exit_code == 3
    assert "DecisionRecord" in " ".join(res.output.split())


def test_unreadable_exports_raise_each_readers_source_error(tmp_path: Path) -> None:
    from triage.audit.reader import DecisionSourceError, read_decisions_file
    from triage.replay.errors import ReplaySourceError
    from triage.replay.export_file import read_export

    missing = tmp_path / "missing.jsonl"
    with pytest.raises(DecisionSourceError, match="cannot read"):
        read_decisions_file(missing, request_id="r1")
    with pytest.raises(ReplaySourceError, match="cannot read"):
        read_export(missing)
