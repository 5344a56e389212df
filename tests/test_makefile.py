"""The Makefile's choice of the interpreter that builds .venv (its PYTHON variable)."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _fake(path: Path, version: str, venv: bool = True) -> Path:
    """An interpreter that answers the Makefile's probes: its version, and whether it can make a venv."""
    path.parent.mkdir(parents=True, exist_ok=True)
    refuse = "" if venv else 'echo "ModuleNotFoundError: No module named \'ensurepip\'" >&2; exit 1'
    path.write_text(f'#!/bin/sh\ncase "$2" in *ensurepip*) {refuse or "exit 0"};; esac\necho "{version}"\n')
    path.chmod(0o755)
    return path


def _chosen(tmp_path: Path, system: Path, on_path: str, *extra: str) -> str:
    _fake(tmp_path / "bin" / "python3", on_path)
    done = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "show: ; @echo $(PYTHON)", "show",
                           f"SYSTEM_PYTHON={system}", *extra], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("system_version,venv,on_path,expected", [
    ("(3, 11)", True, "(3, 11)", "system"),  # the same version: the system's (optimised) build
    ("(3, 11)", True, "(3, 12)", "python3"),  # another version on PATH is the user's choice
    ("(3, 11)", False, "(3, 11)", "python3"),  # the same version, but it cannot make a venv
])
def test_venv_interpreter_is_the_systems_only_where_it_is_the_same_python_and_can_make_a_venv(
        tmp_path, system_version, venv, on_path, expected):
    system = _fake(tmp_path / "system" / "python3", system_version, venv)
    assert _chosen(tmp_path, system, on_path) == (str(system) if expected == "system" else "python3")


def test_python_given_on_the_command_line_wins(tmp_path):
    system = _fake(tmp_path / "system" / "python3", "(3, 11)")
    assert _chosen(tmp_path, system, "(3, 11)", "PYTHON=/opt/py/bin/python3") == "/opt/py/bin/python3"
    assert _chosen(tmp_path, tmp_path / "absent", "(3, 11)") == "python3"  # no system python3 at all
