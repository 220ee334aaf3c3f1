"""A child process runs the code of the process that started it, wherever it starts.

`triage bench pipeline` compares builds by running one tree's bench with PYTHONPATH
naming it; with `python -m triage` alone the children imported whatever `triage` sat in
the working directory, and measured the wrong build (docs/architecture.md, "Measuring
two builds")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import triage
from triage.demo.processes import ChildProcess, same_code_env


def test_a_child_ignores_a_triage_package_in_its_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoy = tmp_path / "triage"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    (decoy / "__main__.py").write_text("import sys\nprint('DECOY TREE')\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    proc = ChildProcess("help", ["--help"], tmp_path / "child.log")
    proc.start()
    assert proc.proc is not None
    code = proc.proc.wait(timeout=120)
    log = (tmp_path / "child.log").read_text(errors="replace")
    assert code == 0, log
    assert "DECOY TREE" not in log
    assert "Usage" in log


def test_the_childs_path_starts_with_this_processes_tree() -> None:
    tree = str(Path(triage.__file__).resolve().parents[1])
    env = same_code_env({"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [tree, "/elsewhere"]
    assert same_code_env({})["PYTHONPATH"] == tree
