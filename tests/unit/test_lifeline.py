"""A child names the parent it must die with; one started after that parent was gone
exits at once with a one-line reason (the kernel's signal would never come)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from triage.lifeline import ENV, child_env

CHILD = "from triage.lifeline import die_with_parent; die_with_parent(); print('running')"


def _run(parent: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if parent is not None:
        env[ENV] = parent
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_child_of_the_named_parent_runs() -> None:
    res = _run(str(os.getpid()))
    assert res.returncode == 0 and res.stdout.strip() == "running", res.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_child_whose_parent_is_gone_exits_with_one_line() -> None:
    res = _run("1")  # not its parent: as if the real one died before the child started
    assert res.returncode == 1
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pid 1" in lines[0] and "gone" in lines[0]


def test_without_the_variable_nothing_changes() -> None:
    assert _run(None).returncode == 0


def test_the_parent_names_itself_from_its_main_thread() -> None:
    assert child_env() == {ENV: str(os.getpid())}


def test_a_helper_thread_names_nobody() -> None:
    """Linux signals when the starting *thread* ends: a helper thread must not arm it."""
    import threading

    seen: list[dict[str, str]] = []
    t = threading.Thread(target=lambda: seen.append(child_env()))
    t.start()
    t.join(timeout=10)
    assert seen == [{}]
