"""The image builds from exactly the files the Dockerfile copies; its dependencies are pinned and their
floors match the generated gRPC code.

The wheel is built (hatchling, offline, no build isolation) from a directory holding only what the
Dockerfile's build stage COPYs: the same build the image runs. Before issue 18 pyproject force-included
examples/, which the Dockerfile did not copy, so the image could not build.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from repo_paths import ROOT

STUBS = [ROOT / "proto" / "slo_proto"]


def build_stage_copies() -> list[tuple[str, str]]:
    """(source, destination) of every COPY in the Dockerfile's first stage (destinations under WORKDIR)."""
    text = (ROOT / "Dockerfile").read_text()
    stage = text.split("\nFROM ", 2)[1]
    copies = []
    for line in stage.splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            *sources, dest = parts[1:]
            copies += [(src, dest) for src in sources]
    return copies


@pytest.mark.slow
def test_the_wheel_builds_from_exactly_the_files_the_dockerfile_copies(tmp_path: Path) -> None:
    context = tmp_path / "src"
    context.mkdir()
    for src, dest in build_stage_copies():
        target = context / dest if not dest.endswith("/") else context / dest / Path(src).name
        target = target.resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / src).is_dir():
            shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / src, target)
    out = tmp_path / "dist"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            ".",
        ],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"the image's build step fails:\n{proc.stderr[-3000:]}"
    (wheel,) = out.glob("slofleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "slo_lab/localfleet/examples/slopolicy-chat-agent.yaml" in names
    for package in (
        "slo_core",
        "slo_proto",
        "slo_net",
        "slo_router",
        "slo_sidecar",
        "slo_operator",
        "slo_vllm_plugin",
        "slo_lab",
    ):
        assert f"{package}/__init__.py" in names
    assert any(n.endswith("slo_vllm_plugin/scheduler.py") for n in names)


def stub_versions() -> tuple[Version, Version]:
    """(protobuf, grpcio) versions the generated stubs require at import."""
    protobuf, grpcio = [], []
    for folder in STUBS:
        text = (folder / "slofleet_pb2.py").read_text()
        protobuf.append(Version(re.search(r"Protobuf Python Version: ([\d.]+)", text).group(1)))  # type: ignore[union-attr]
        text = (folder / "slofleet_pb2_grpc.py").read_text()
        grpcio.append(Version(re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", text).group(1)))  # type: ignore[union-attr]
    return max(protobuf), max(grpcio)


def floors() -> dict[str, Version]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {}
    for extra in ("service", "dev"):
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            for spec in req.specifier:
                if spec.operator == ">=":
                    out[req.name] = Version(spec.version)
    return out


def pinned(name: str) -> Version | None:
    """The version ``name`` is pinned to (``==``) in the dev extra, if it is."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["optional-dependencies"]["dev"]:
        req = Requirement(line)
        if req.name == name:
            return next((Version(s.version) for s in req.specifier if s.operator == "=="), None)
    return None


def test_dependency_floors_match_the_generated_grpc_code() -> None:
    protobuf, grpcio = stub_versions()
    have = floors()
    assert have["protobuf"] >= protobuf, (
        f"stubs need protobuf >= {protobuf}; pyproject allows {have['protobuf']}"
    )
    assert have["grpcio"] >= grpcio, f"stubs need grpcio >= {grpcio}; pyproject allows {have['grpcio']}"
    # the stubs carry their generator's version: only that generator reproduces them
    assert pinned("grpcio-tools") == grpcio, "pin grpcio-tools to the version that generated the stubs"


def lock() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements" / "image.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            pins[name.lower().replace("_", "-")] = Version(version)
    return pins


def test_the_image_lock_pins_every_service_dependency_within_pyproject() -> None:
    assert "-c requirements/image.lock" in (ROOT / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = lock()
    extras = project["optional-dependencies"]
    for line in [*project["dependencies"], *extras["service"], *extras["operator"], *extras["predictor"]]:
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in requirements/image.lock"
        assert pins[name] in req.specifier, f"{name}=={pins[name]} violates pyproject's {req.specifier}"
    protobuf, grpcio = stub_versions()
    assert pins["protobuf"] >= protobuf and pins["grpcio"] >= grpcio
