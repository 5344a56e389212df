"""The Makefile's choice of the interpreter that builds .venv (its VENV_PYTHON variable)."""

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
    # not what an enclosing make passes down (make check-breaks VENV_PYTHON=...), nor the shell's own
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "VENV_PYTHON", "SYSTEM_PYTHON")}
    done = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "show: ; @echo $(VENV_PYTHON)", "show",
                           f"SYSTEM_PYTHON={system}", *extra], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**inherited, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
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


def test_venv_python_given_on_the_command_line_wins(tmp_path):
    system = _fake(tmp_path / "system" / "python3", "(3, 11)")
    assert _chosen(tmp_path, system, "(3, 11)", "VENV_PYTHON=/opt/py/bin/python3") == "/opt/py/bin/python3"


def test_without_a_system_python3_it_is_the_one_on_path(tmp_path):
    assert _chosen(tmp_path, tmp_path / "absent", "(3, 11)") == "python3"
    spaced = _fake(tmp_path / "a dir" / "python3", "(3, 11)")  # a path with a space is one path
    assert _chosen(tmp_path, spaced, "(3, 11)") == str(spaced)


def test_install_runs_again_when_its_torch_or_installer_changes_and_back(tmp_path):
    """`make install` on an installed .venv: nothing with the same settings, an install with
    another TORCH or INSTALLER, and again on switching back (the other settings' stamp is gone)."""
    for name in ("Makefile", "requirements.txt", "requirements-plugin-test.txt", "pyproject.toml"):
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    log = tmp_path / "installs.log"
    for tool in ("python", "uv"):  # stand-ins for .venv's own: they record what they were asked to install
        _fake(tmp_path / ".venv" / "bin" / tool, "(3, 11)").write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
    inherited = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    inherited["PIP_FIND_LINKS"] = "/wheels/a /wheels/b"  # pip's wheel folders, which uv reads only when told

    def install(*settings: str, environment: dict = inherited) -> str:
        before = log.read_text() if log.exists() else ""
        done = subprocess.run(["make", "-s", "--no-print-directory", "install", *settings], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, env=environment)
        assert done.returncode == 0, done.stderr
        return (log.read_text() if log.exists() else "")[len(before):]

    first = install()
    assert "uv pip install -q --python .venv/bin/python --compile-bytecode --find-links /wheels/a --find-links " \
           "/wheels/b torch==2.13.0\n" in first and install() == "", first
    # no wheel folders named: pip installs torch, reading its own settings (pip.conf's among them)
    other = install("TORCH=torch==2.9.1", environment={k: v for k, v in inherited.items() if k != "PIP_FIND_LINKS"})
    assert "python -m pip install -q torch==2.9.1\n" in other and "--find-links" not in other, other
    assert install("TORCH=torch==2.9.1") == ""
    assert 'torch==2.13.0' in install()  # back to the default: installed again
    by_pip = install("INSTALLER=pip")  # installed again, each requirement by pip
    assert "-m pip install -q -r requirements.txt" in by_pip and "uv " not in by_pip, by_pip
    assert install("INSTALLER=pip") == ""
    assert len(list((tmp_path / ".venv").glob(".installed*"))) == 1
