"""The slofleet image (Dockerfile) fits what the operator and the chart expect of it.

No container engine runs here, so these check the Dockerfile's contract statically: the plugin lies where
the engine pods' init container copies it from, the user is the chart's non-root uid, the entrypoint is the
``slofleet`` command, and the plugin imports nothing a vLLM image lacks.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import yaml
from repo_paths import ROOT

from slo_operator import pod

DOCKERFILE = (ROOT / "Dockerfile").read_text()
# What the init container copies into vLLM pods: the plugin, core and the generated stubs, nothing else.
PACKAGES = {
    "slo_core": ROOT / "core" / "slo_core",
    "slo_vllm_plugin": ROOT / "vllm_plugin" / "slo_vllm_plugin",
    "slo_proto": ROOT / "proto" / "slo_proto",
}
# What the vLLM image itself provides to modules on its PYTHONPATH.
VLLM_PROVIDES = {"vllm", "torch", "grpc", "google", "prometheus_client", "numpy", "pydantic", "yaml"}


def final_stage() -> str:
    return DOCKERFILE.rsplit("\nFROM ", 1)[1]


def test_plugin_is_copied_where_the_init_container_looks() -> None:
    assert pod.PLUGIN_SOURCE_DIR == "/opt/slofleet/plugin"
    assert f"COPY --from=build {pod.PLUGIN_SOURCE_DIR} {pod.PLUGIN_SOURCE_DIR}" in final_stage()
    (copied,) = re.findall(rf"cp -R ((?:\S+ )+){pod.PLUGIN_SOURCE_DIR}/", DOCKERFILE)
    assert sorted(copied.split()) == sorted(str(p.relative_to(ROOT)) for p in PACKAGES.values())


def test_runs_as_the_charts_non_root_user_with_the_slofleet_entrypoint() -> None:
    values = yaml.safe_load((ROOT / "charts" / "slofleet" / "values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    (user,) = re.findall(r"^USER (\S+)$", final_stage(), re.MULTILINE)
    assert user == f"{uid}:{values['podSecurityContext']['runAsGroup']}" and uid > 0
    assert 'ENTRYPOINT ["slofleet"]' in final_stage()


def test_installs_every_package_with_the_extras_the_services_need() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    for package in wheel:
        folder = package.split("/")[0]
        assert f"COPY {folder} ./{folder}" in DOCKERFILE, folder
    (extras,) = re.findall(r'pip install (?:-c \S+ )?"\.\[([a-z,]+)\]"', DOCKERFILE)
    declared = project["project"]["optional-dependencies"]
    assert {"service", "operator", "predictor"} <= set(extras.split(",")) <= set(declared)


def _module_file(name: str) -> Path | None:
    top, *rest = name.split(".")
    base = PACKAGES[top].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(name: str, path: Path) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):  # function-level imports count too
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return found


def test_the_plugin_imports_only_what_a_vllm_image_provides() -> None:
    module = pod.SCHEDULER_CLS.rpartition(".")[0]
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        path = _module_file(name)
        if path is None:
            continue
        for imported in _imports(name, path):
            top = imported.split(".")[0]
            if top in PACKAGES:
                todo.append(imported)
            elif top.startswith("slo_"):
                outside.add(top)  # another slofleet package: not in the vLLM pod
            elif top not in sys.stdlib_module_names:
                outside.add(top)
    assert "slo_vllm_plugin.scheduler" in seen and "slo_core" in seen
    assert outside <= VLLM_PROVIDES, (
        f"the plugin needs {sorted(outside - VLLM_PROVIDES)}, absent from vLLM's image"
    )
