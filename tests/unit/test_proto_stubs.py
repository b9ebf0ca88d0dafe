"""The checked-in gRPC stubs of each service are exactly what proto/slofleet.proto generates."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {
    "slo_sidecar": ROOT / "engine_sidecar/slo_sidecar/proto",
    "slo_router": ROOT / "router/slo_router/proto",
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    args = ["protoc", f"-I{ROOT / 'proto'}", f"--python_out={out}", f"--pyi_out={out}"]
    args += [f"--grpc_python_out={out}", str(ROOT / "proto/slofleet.proto")]
    assert protoc.main(args) == 0
    return out


@pytest.mark.parametrize("module", sorted(SERVICES))
def test_checked_in_stubs_match_the_proto(generated: Path, module: str) -> None:
    folder = SERVICES[module]
    for name in ("slofleet_pb2.py", "slofleet_pb2.pyi", "slofleet_pb2_grpc.py"):
        want = (generated / name).read_text()
        if name == "slofleet_pb2_grpc.py":
            want = want.replace("import slofleet_pb2 as", f"from {module}.proto import slofleet_pb2 as")
        assert (folder / name).read_text() == want, f"{folder / name} is stale: run scripts/gen_proto.sh"


def test_both_services_speak_the_same_messages() -> None:
    from slo_router.proto import slofleet_pb2 as router_pb2
    from slo_sidecar.proto import slofleet_pb2 as sidecar_pb2

    state = sidecar_pb2.PodState(pod="p", waiting=3, kv_usage=0.5)
    state.requests.add(request_id="r1", kind="deadline", output_bound=120)
    decoded = router_pb2.PodState.FromString(state.SerializeToString())
    assert (decoded.pod, decoded.waiting, decoded.kv_usage) == ("p", 3, 0.5)
    assert decoded.requests[0].output_bound == 120
