"""The compiled build (mypyc, `make compile`) must decide exactly as the pure sources do.

The same random event sequence runs in a child process on the build (when there is
one) and in a child process forced onto the sources (TRIAGE_PURE_CORE=1); the
decisions must match to the last field. The same for whole simulations (the event
loop, GPU model, workload streams and metrics are compiled too): every figure of the
result must match. Without a build, both sides run the sources: still a check that
results do not depend on the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import json, random, sys
sys.path.insert(0, sys.argv[1])
from _core_factory import config, model, tenant
from triage.admission.core import AdmissionCore
import triage.admission.dispatcher as d
cfg = config(
    tenants=[tenant("a", rate_tokens_per_s=3000, burst_tokens=8000, max_debt_tokens=4000,
                    queue_max=6, max_queue_wait_ms=700, sla_ms=20000, weight=2.0),
             tenant("b", rate_tokens_per_s=2000, burst_tokens=6000, allow_overage=True,
                    queue_max=4, max_queue_wait_ms=1500, sla_ms=60000, max_concurrency=3),
             tenant("vip", queue_max=3, max_queue_wait_ms=300, sla_ms=8000,
                    reserved_kv_share=0.2)],
    models=[model("m8", reserved_kv_gib_per_gpu=0.1),
            model("m70", layers=80, reserved_kv_gib_per_gpu=0.15, decode_s_per_token=0.03)],
    gpus=3, kv_budget_gib=1.0, queue_max=10,
    hysteresis={"low": 0.4, "high": 0.6, "hold_s": 0.5, "relax_after_s": 1.0,
                "autoscale_after_s": 1.0})
core = AdmissionCore(cfg)
disp = core.dispatchers["p"]
rng = random.Random(int(sys.argv[2]))
out = []
now = 0.0
for i in range(3000):
    now += rng.uniform(0.0, 0.05)
    r = rng.random()
    if r < 0.6:
        out += core.submit(f"r{i}", rng.choice(["a", "b", "vip"]), rng.choice(["m8", "m70"]),
                           rng.randint(1, 1500), rng.randint(1, 1000), now)
    elif r < 0.9 and disp.inflight:
        running = sorted(disp.inflight.values(), key=lambda p: p.seq)
        p = running[rng.randrange(len(running))]
        out += core.complete(pool="p", request_id=p.request_id, attempt=p.attempt,
                             ok=rng.random() < 0.95, output_tokens=int(p.expected_out),
                             prefill_s=rng.uniform(0.001, 0.1), decode_s=rng.uniform(0.05, 2.0),
                             concurrency=float(p.gpu.running), now=now)
    else:
        out += core.tick(now)
print(json.dumps({"compiled": not d.__file__.endswith(".py"),
                  "decisions": [[str(v) for v in x.astuple()] for x in out]}))
'''


SIM_SCRIPT = r'''
import json, sys
import triage.sim.engine as e
from triage.sim.compare import compare
from triage.sim.scenario import load_scenario
seed = int(sys.argv[2])
out = {}
for name in ("seed-morning", "multi-model"):
    sc = load_scenario(name).scaled(0.05).with_seed(seed)
    cmp = compare(sc, ["full", "admit_all", "bounded_queue"])
    out[name] = {p: {**r.to_dict(series=True), "wall_s": 0.0} for p, r in cmp.results.items()}
print(json.dumps({"compiled": not e.__file__.endswith(".py"), "results": out}))
'''


HANDLERS_SCRIPT = r'''
import hashlib, json, logging, sys
logging.disable(logging.INFO)
import triage.streams.codec as codec
from triage.bench import handlers
from triage.streams.store import MappingStore
written = []
send, put = handlers._WorkOutbox.send_raw, MappingStore.put_request_raw
def sent(self, topic, key, value):
    written.append((topic, key, value))
    send(self, topic, key, value)
def stored(self, rid, raw, outputs=None, bucket=None):
    written.append(("record", rid.encode(), raw))
    put(self, rid, raw, outputs, bucket)
handlers._WorkOutbox.send_raw = sent
MappingStore.put_request_raw = stored
handlers.run(requests=400 + 100 * int(sys.argv[2]), tenants=3)
digest = hashlib.sha256(repr(written).encode()).hexdigest()
print(json.dumps({"compiled": not codec.__file__.endswith(".py"), "writes": len(written),
                  "digest": digest}))
'''


def _run(pure: bool, seed: int, script: str = SCRIPT) -> dict[str, object]:
    env = {**os.environ}
    if pure:
        env["TRIAGE_PURE_CORE"] = "1"
    else:
        env.pop("TRIAGE_PURE_CORE", None)
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", script, str(here), str(seed)], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_compiled_and_pure_cores_decide_identically() -> None:
    for seed in (1, 2):
        pure = _run(True, seed)
        native = _run(False, seed)
        assert pure["compiled"] is False
        assert isinstance(pure["decisions"], list) and len(pure["decisions"]) > 1000
        assert native["decisions"] == pure["decisions"]


def test_compiled_and_pure_simulators_agree_on_every_figure() -> None:
    pure = _run(True, 3, SIM_SCRIPT)
    native = _run(False, 3, SIM_SCRIPT)
    assert pure["compiled"] is False
    results = pure["results"]
    assert isinstance(results, dict) and results["seed-morning"]["full"]["arrivals"] > 500
    assert native["results"] == results


def test_compiled_and_pure_record_builders_write_the_same_bytes() -> None:
    """The admission app's outputs and table records, byte for byte (streams/codec.py is
    compiled too): a burst of requests, queued and started, then completed."""
    pure = _run(True, 1, HANDLERS_SCRIPT)
    native = _run(False, 1, HANDLERS_SCRIPT)
    assert pure["compiled"] is False
    assert isinstance(pure["writes"], int) and pure["writes"] > 3000
    assert native == {**pure, "compiled": native["compiled"]}
