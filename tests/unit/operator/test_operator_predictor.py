"""A retrained length predictor rolled out to a ModelDeployment: spec.sidecar.predictor mounts its
ConfigMap read-only and pins its SHA-256; the sidecar refuses an artefact with any other digest."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import yaml
from repo_paths import ROOT

from slo_core.crd.deployment import ModelDeploymentSpec
from slo_core.predict.training import LengthRow, train_estimator
from slo_operator import model, pod
from slo_operator.settings import OperatorSettings
from slo_sidecar.estimators import load_length_estimator

DIGEST = "ab" * 32


def _md(predictor: dict[str, str] | None) -> model.ModelDeploymentView:
    body = yaml.safe_load((ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml").read_text())
    body["metadata"].update(uid="00000000-0000-4000-8000-000000000001", generation=1)
    body = copy.deepcopy(body)
    if predictor is not None:
        body["spec"].setdefault("sidecar", {})["predictor"] = predictor
    return model.view(body)


def test_predictor_configmap_is_mounted_and_pinned() -> None:
    settings = OperatorSettings(priority=1)
    md = _md({"configMap": "slofleet-predictor-llama", "sha256": DIGEST})
    spec = pod.pod_spec(md, settings, "policy-cm")
    sidecar = next(c for c in spec["containers"] if c["name"] == "sidecar")
    assert f"--predictor={pod.PREDICTOR_DIR}/predictor.npz" in sidecar["args"]
    assert f"--predictor-sha256={DIGEST}" in sidecar["args"]
    assert {"name": "predictor", "mountPath": pod.PREDICTOR_DIR, "readOnly": True} in sidecar["volumeMounts"]
    assert {"name": "predictor", "configMap": {"name": "slofleet-predictor-llama"}} in spec["volumes"]
    # without it nothing changes (the shipped predictor)
    plain = pod.pod_spec(_md(None), settings, "policy-cm")
    assert not any("predictor" in a for c in plain["containers"] for a in c.get("args", []))


def test_the_digest_must_be_a_sha256() -> None:
    with pytest.raises(ValueError, match="sha256"):
        ModelDeploymentSpec.model_validate(
            {**_base_spec(), "sidecar": {"predictor": {"configMap": "x", "sha256": "not-a-digest"}}}
        )


def _base_spec() -> dict[str, object]:
    body = yaml.safe_load((ROOT / "examples" / "modeldeployment-llama-8b-h100.yaml").read_text())
    return dict(body["spec"])


def test_sidecar_refuses_an_artefact_with_another_digest(tmp_path: Path) -> None:
    rng = random.Random(0)
    rows = [LengthRow(f"r{i}", "", rng.randint(1, 50), rng.randint(1, 100)) for i in range(100)]
    path = tmp_path / "predictor.npz"
    digest = train_estimator(rows, n_trees=3, min_samples_leaf=5).save(path)
    _est, source = load_length_estimator(str(path), None, digest)
    assert digest[:12] in source
    with pytest.raises(ValueError, match=r"(?i)sha-?256|hash|match"):
        load_length_estimator(str(path), None, DIGEST)
