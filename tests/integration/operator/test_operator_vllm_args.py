"""The engine arguments the operator renders are accepted by vLLM's own OpenAI-server argument parser.

vLLM lives in its own pinned environment (``.venv-vllm``, set up by scripts/test.sh); this test runs
its interpreter on the arguments rendered for the examples (importing vLLM takes ~30 s on two cores), and
skips where that environment is absent.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from repo_paths import ROOT

from slo_operator import model, pod
from slo_operator.settings import OperatorSettings

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for args in json.loads(sys.stdin.read()):
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
    out.append({"model": ns.model, "tp": ns.tensor_parallel_size, "scheduler_cls": str(ns.scheduler_cls),
                "port": ns.port, "lora": [m.name for m in (ns.lora_modules or [])]})
print(json.dumps(out))
"""


def _has_vllm() -> bool:
    return any(ROOT.glob(".venv-vllm/lib/python3*/site-packages/vllm/__init__.py")) and VLLM_PYTHON.exists()


@pytest.mark.slow
@pytest.mark.skipif(not _has_vllm(), reason="no .venv-vllm with vllm (scripts/test.sh sets it up)")
def test_vllm_accepts_the_rendered_engine_arguments() -> None:
    settings = OperatorSettings(priority=1)
    files = ["modeldeployment-llama-8b-h100.yaml", "modeldeployment-llama-70b-h100x4.yaml"]
    args = [
        pod.engine_args(model.view(yaml.safe_load((ROOT / "examples" / f).read_text())), settings)
        for f in files
    ]
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", PARSE], input=json.dumps(args), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [p["scheduler_cls"] for p in parsed] == [pod.SCHEDULER_CLS] * 2
    assert [p["tp"] for p in parsed] == [1, 4] and parsed[0]["port"] == settings.engine_port
    assert parsed[1]["model"] == "/models/meta-llama/Llama-3.1-70B-Instruct" and parsed[1]["lora"] == [
        "llama-70b-sql"
    ]
