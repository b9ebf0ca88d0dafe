"""The committed CRDs are what the models render, Kubernetes accepts them, and `slofleet crds` works."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from repo_paths import ROOT

from slo_core.crd.cli import register
from slo_core.crd.generate import OUTPUT_DIRS, modeldeployment_crd, rendered, slopolicy_crd

CRD_FILES = ["slopolicies.slofleet.io.yaml", "modeldeployments.slofleet.io.yaml"]


@pytest.mark.parametrize("folder", OUTPUT_DIRS)
@pytest.mark.parametrize("name", CRD_FILES)
def test_committed_crds_match_the_models(folder: str, name: str) -> None:
    committed = (ROOT / folder / name).read_text(encoding="utf-8")
    assert committed == rendered()[name], f"{folder}/{name} is stale: run `slofleet crds`"


def test_generation_is_deterministic() -> None:
    assert rendered() == rendered()
    assert sorted(rendered()) == sorted(CRD_FILES)


@pytest.mark.parametrize("name", CRD_FILES)
@pytest.mark.parametrize("k8s_version", ["1.27.0", "1.32.0"])
def test_crd_objects_pass_kubernetes_validate_strict(name: str, k8s_version: str) -> None:
    doc = yaml.safe_load((ROOT / "crds" / name).read_text(encoding="utf-8"))
    kubernetes_validate.validate(doc, k8s_version, strict=True)


def test_kubernetes_validate_would_catch_a_broken_crd() -> None:
    doc = slopolicy_crd()
    doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["nullable"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


def _nodes(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        out += _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        out += _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _nodes(node["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize(
    "crd", [slopolicy_crd(), modeldeployment_crd()], ids=["SLOPolicy", "ModelDeployment"]
)
def test_schemas_are_structural_and_documented(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _nodes(schema["properties"]["spec"], ".spec") + _nodes(
        schema["properties"]["status"], ".status"
    ):
        assert "$ref" not in node and "nullable" not in node and "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "description" in node or path.endswith(("[]", "{}")), f"{path} has no description"
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node, path
            assert node.get("type") in ("object", "array", "string", "number", "integer", "boolean"), path
        if isinstance(node.get("exclusiveMinimum"), bool):
            assert "minimum" in node, path
        if node.get("default") is not None and "enum" in node:
            assert node["default"] in node["enum"], path


def _columns(crd: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}


def test_crds_carry_names_columns_status_and_cel_rules() -> None:
    policy, deployment = slopolicy_crd(), modeldeployment_crd()
    assert policy["spec"]["names"]["shortNames"] == ["slo"]
    assert deployment["spec"]["names"]["shortNames"] == ["md"]
    for crd in (policy, deployment):
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        assert crd["spec"]["scope"] == "Namespaced"
    md_columns = _columns(deployment)
    assert md_columns["Phase"] == ".status.phase"
    assert md_columns["Ready"] == ".status.readyReplicas"
    assert md_columns["Model"] == ".spec.model.servedName"
    assert md_columns["Policy"] == ".spec.policyRef"
    slo_columns = _columns(policy)
    assert slo_columns["Tiers"] == ".spec.tiers[*].name"
    assert slo_columns["Default"] == ".spec.defaultTier"
    spec = policy["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    messages = [v["message"] for v in spec["x-kubernetes-validations"]]
    assert "tier names must be unique" in messages
    tier_rules = spec["properties"]["tiers"]["items"]["x-kubernetes-validations"]
    assert any("tbtS" in r["rule"] for r in tier_rules)


def main(argv: list[str]) -> int:
    """`slofleet crds ...` through the subcommand's own parser (other subcommands stay out of the way)."""
    parser = argparse.ArgumentParser(prog="slofleet crds")
    register(parser)
    args = parser.parse_args(argv[1:])
    code: int = args.func(args)
    return code


def test_cli_check_reports_drift_and_write_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "charts/slofleet").mkdir(parents=True)
    (tmp_path / "charts/slofleet/Chart.yaml").write_text("name: slofleet\n")
    assert main(["crds", "--check", "--root", str(tmp_path)]) == 1
    assert "stale: crds/slopolicies.slofleet.io.yaml" in capsys.readouterr().err
    assert main(["crds", "--root", str(tmp_path)]) == 0
    for folder in OUTPUT_DIRS:
        for name in CRD_FILES:
            assert (tmp_path / folder / name).read_bytes() == (ROOT / "crds" / name).read_bytes()
    assert main(["crds", "--check", "--root", str(tmp_path)]) == 0
    target = tmp_path / "charts/slofleet/crds" / CRD_FILES[1]
    target.write_text(target.read_text().replace("minimum: 1", "minimum: 2", 1))
    assert main(["crds", "--check", "--root", str(tmp_path)]) == 1
    assert "stale: charts/slofleet/crds/modeldeployments" in capsys.readouterr().err


def test_repository_check_passes() -> None:
    assert main(["crds", "--check", "--root", str(ROOT)]) == 0


def test_chart_copy_is_byte_identical() -> None:
    for name in CRD_FILES:
        assert (ROOT / "charts/slofleet/crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes()
    assert sorted(p.name for p in (ROOT / "charts/slofleet/crds").iterdir()) == sorted(CRD_FILES)


def test_outside_a_checkout_only_crds_are_written(tmp_path: Path) -> None:
    assert main(["crds", "--root", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "crds").iterdir()) == sorted(CRD_FILES)
    assert not (tmp_path / "charts").exists()


def test_stdout_is_a_stream_kubectl_can_apply(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--stdout"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    names = [d["metadata"]["name"] for d in docs]
    assert names == ["slopolicies.slofleet.io", "modeldeployments.slofleet.io"]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32.0", strict=True)
