"""Optional build step: compile the admission core and the simulator with mypyc.

`pip install -e .` alone installs pure Python. With TRIAGE_COMPILE=1 (what
`make install` sets), the hot modules below are compiled to C extension modules
beside their sources, as one group: the same code, type-checked by mypy, about twice
as fast. `make compile` rebuilds them after an edit (the Makefile reads this list);
a stale build is detected and set aside at import (triage/native.py).
"""

from __future__ import annotations

import os

from setuptools import setup

COMPILED = [
    "triage/topics/reasons.py",  # enum members of a compiled module are read from C statics
    # the admission app's record, reply and work-item builders (reads the core's objects
    # natively: -13% of the handlers' instructions, docs/architecture.md)
    "triage/streams/codec.py",
    "triage/admission/record.py",
    "triage/admission/heaps.py",
    "triage/admission/policy.py",
    "triage/admission/decision.py",
    "triage/admission/quota.py",
    "triage/admission/predictor.py",
    "triage/admission/kvcache.py",
    "triage/admission/fairness.py",
    "triage/admission/queue.py",
    "triage/admission/preemption.py",
    "triage/admission/hysteresis.py",
    "triage/admission/pending.py",
    "triage/admission/placement.py",
    "triage/admission/outcomes.py",
    "triage/admission/serving.py",
    "triage/admission/dispatcher.py",
    "triage/admission/gate.py",
    "triage/admission/core.py",
    # the simulator's event loop, GPU model, workload streams and metrics
    "triage/sim/engine.py",
    "triage/sim/gpu.py",
    "triage/sim/workload.py",
    "triage/sim/arrivals.py",
    "triage/sim/dists.py",
    "triage/sim/metrics.py",
    "triage/sim/histogram.py",
    "triage/sim/series.py",
]

ext_modules = []
if os.environ.get("TRIAGE_COMPILE") == "1":
    from mypyc.build import mypycify

    # the shared runtime library lands inside the package (not at the repo root)
    ext_modules = mypycify(COMPILED, opt_level="3", debug_level="0",
                           group_name="triage.admission.native")

setup(ext_modules=ext_modules)
