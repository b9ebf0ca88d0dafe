"""Repository layout guarantees a user relies on: the stdlib is never shadowed, the CLI lists commands."""

from __future__ import annotations

import subprocess
import sys

from repo_paths import ROOT


def test_stdlib_operator_is_not_shadowed_from_the_repository_root() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import operator, enum; print(operator.__file__); print(enum.Enum)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "site-packages" not in out.stdout.splitlines()[0]
    assert str(ROOT / "operator") not in out.stdout
    assert "<enum 'Enum'>" in out.stdout


def test_no_init_files_in_tests() -> None:
    assert not list((ROOT / "tests").rglob("__init__.py"))


def test_cli_lists_its_subcommands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "slo_core.cli", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "usage: slofleet" in out.stdout
    # every subcommand registered through entry points is listed with its help
    from importlib.metadata import entry_points

    for ep in entry_points(group="slofleet.commands"):
        assert ep.name in out.stdout
