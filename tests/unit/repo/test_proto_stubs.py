"""The checked-in gRPC stubs are what proto/slofleet.proto generates, in one package for every side."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_tools import protoc
from repo_paths import ROOT

STUBS = ROOT / "proto/slo_proto"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    args = ["protoc", f"-I{ROOT / 'proto'}", f"--python_out={out}", f"--pyi_out={out}"]
    args += [f"--grpc_python_out={out}", str(ROOT / "proto/slofleet.proto")]
    assert protoc.main(args) == 0
    return out


@pytest.mark.parametrize("name", ["slofleet_pb2.py", "slofleet_pb2.pyi", "slofleet_pb2_grpc.py"])
def test_checked_in_stubs_match_the_proto(generated: Path, name: str) -> None:
    want = (generated / name).read_text()
    if name == "slofleet_pb2_grpc.py":
        want = want.replace("import slofleet_pb2 as", "from slo_proto import slofleet_pb2 as")
    assert (STUBS / name).read_text() == want, f"{STUBS / name} is stale: run scripts/gen_proto.sh"


def test_there_is_one_copy_of_the_generated_code() -> None:
    folders = ["core", "router", "engine_sidecar", "operator", "vllm_plugin", "lab", "proto"]
    copies = sorted(p.relative_to(ROOT) for f in folders for p in (ROOT / f).rglob("slofleet_pb2.py"))
    assert copies == [Path("proto/slo_proto/slofleet_pb2.py")]


def test_messages_round_trip() -> None:
    from slo_proto import slofleet_pb2

    state = slofleet_pb2.PodState(pod="p", waiting=3, kv_usage=0.5)
    state.requests.add(request_id="r1", kind="deadline", output_bound=120)
    decoded = slofleet_pb2.PodState.FromString(state.SerializeToString())
    assert (decoded.pod, decoded.waiting, decoded.kv_usage) == ("p", 3, 0.5)
    assert decoded.requests[0].output_bound == 120
