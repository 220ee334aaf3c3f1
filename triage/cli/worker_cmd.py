"""`triage worker`: run one GPU's worker (sim or OpenAI-compatible backend)."""

from __future__ import annotations

import asyncio
import logging
import os
from enum import StrEnum
from pathlib import Path

import typer

from triage.cli.common import ExitCode, bootstrap_option, config_option, fail, load_or_exit
from triage.config.models import TriageConfig
from triage.workers.backends.base import Backend
from triage.workers.errors import BackendError

log = logging.getLogger(__name__)


class BackendKind(StrEnum):
    SIM = "sim"
    OPENAI = "openai"


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the root app."""
    app.command("worker")(worker)


def worker(
    gpu: str = typer.Option(
        ..., "--gpu", metavar="ID", help="GPU id from the config's pools (e.g. gpu-0)."
    ),
    backend: BackendKind = typer.Option(
        BackendKind.SIM,
        "--backend",
        help="sim: a continuous-batching timing model of the GPU. openai: stream from an "
        "OpenAI-compatible server (vLLM, llama.cpp): /v1/completions, /v1/chat/completions "
        "for chat prompts; API key from $OPENAI_API_KEY (worker.openai_api_key_env); engine "
        "load from its /metrics.",
    ),
    config: Path | None = config_option("triage.yaml (default: the shipped example)."),
    openai_url: str | None = typer.Option(
        None,
        "--openai-url",
        metavar="URL",
        help="Base URL of the server, e.g. http://127.0.0.1:8000/v1 "
        "(default: worker.openai_base_url).",
    ),
    time_scale: float | None = typer.Option(
        None,
        "--time-scale",
        min=1e-6,
        metavar="X",
        help="sim: wall seconds per simulated second (<1 runs faster; "
        "default: worker.sim_time_scale).",
    ),
    sim_noise: float = typer.Option(
        0.05,
        "--sim-noise",
        min=0.0,
        max=2.0,
        help="sim: lognormal sigma on prefill and step times, so predictions have error.",
    ),
    bootstrap: str | None = bootstrap_option(),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        min=0,
        max=65535,
        help="Prometheus port (default: metrics.worker_port_base + the GPU's index).",
    ),
    device_index: int = typer.Option(0, "--device-index", min=0, help="NVML device to probe."),
    replies: bool = typer.Option(
        False,
        "--replies/--no-replies",
        help="Also send the terminal reply to the tenant. Off by default: the admission "
        "app sends it from the completion.",
    ),
    drain_s: float = typer.Option(
        10.0, "--drain-s", min=0.0, help="On SIGTERM, seconds in-flight work may finish."
    ),
) -> None:
    """Run the worker of one GPU (NVML probe; sim or OpenAI-compatible backend).

    Consumes its work topic, executes, publishes completions and heartbeats. Without an
    NVML driver it runs as the simulated GPU the config declares (heartbeats say
    simulated=true). Stop with SIGTERM or Ctrl-C."""
    from triage.workers.worker import WorkerOptions, run_worker

    cfg = load_or_exit(config, bootstrap=bootstrap)
    if cfg.pool_of_gpu(gpu) is None:
        known = ", ".join(cfg.all_gpus()) or "none"
        raise fail(f"--gpu: unknown GPU {gpu!r}; the config's pools have: {known}",
                   ExitCode.USAGE)  # fmt: skip
    try:
        engine = _backend(cfg, gpu, backend, openai_url=openai_url, time_scale=time_scale,
                          sim_noise=sim_noise)  # fmt: skip
    except BackendError as exc:
        raise fail(f"--openai-url: {exc}", ExitCode.USAGE) from None
    options = WorkerOptions(bootstrap=bootstrap, metrics_port=metrics_port,
                            device_index=device_index, send_replies=replies,
                            drain_s=drain_s)  # fmt: skip
    try:
        asyncio.run(run_worker(cfg, gpu, engine, options=options, handle_signals=True))
    except OSError as exc:  # the metrics port taken, most often
        raise fail(f"worker {gpu} stopped: {exc}", ExitCode.FAILED) from None


def _backend(
    cfg: TriageConfig,
    gpu: str,
    kind: BackendKind,
    *,
    openai_url: str | None,
    time_scale: float | None,
    sim_noise: float,
) -> Backend:
    if kind is BackendKind.SIM:
        from triage.workers.backends.sim import SimBackend

        return SimBackend(config=cfg, gpu_id=gpu, time_scale=time_scale, noise=sim_noise)
    from triage.workers.backends.openai import OpenAIBackend
    from triage.workers.backends.vllm_metrics import metrics_url_for

    w = cfg.worker
    base = openai_url or w.openai_base_url
    metrics = w.openai_metrics_url if w.openai_metrics_url is not None else metrics_url_for(base)
    return OpenAIBackend(
        base_url=base,
        model_map=dict(w.openai_model_map),
        api_key=os.environ.get(w.openai_api_key_env) or None,
        metrics_url=metrics or None,
        metrics_interval_s=w.openai_metrics_s,
    )
