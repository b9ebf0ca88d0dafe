"""The operator's tag-key rotation pass against an in-memory API: one replica wins a race (the other's
replace carries a stale resourceVersion and gets 409), copies follow, a missing copy is not created."""

from __future__ import annotations

import base64
from typing import Any

from slo_core.wire.keyring import MIN_PERIOD_S, KeyRing, parse_keyring, render_keyring
from slo_operator.keyrotation import KeyRotator
from slo_operator.kubeapi import ApiError
from slo_operator.settings import OperatorSettings

NAME = "slofleet-tag-key"
K0 = b"0" * 32


class FakeApi:
    """Secrets by namespace with resourceVersions; PUT refuses a stale one like the API server."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.secrets = {ns: (text, 1) for ns, text in secrets.items()}
        self.puts: list[str] = []

    def _obj(self, ns: str) -> dict[str, Any]:
        text, version = self.secrets[ns]
        meta = {"name": NAME, "namespace": ns, "resourceVersion": str(version)}
        return {"metadata": meta, "data": {"keys": base64.b64encode(text.encode()).decode()}}

    def get(self, _v: str, _plural: str, ns: str, _name: str) -> dict[str, Any] | None:
        return self._obj(ns) if ns in self.secrets else None

    def request(self, method: str, path: str, body: Any = None, *_: Any, **__: Any) -> dict[str, Any]:
        assert method == "PUT" and path.endswith(f"/secrets/{NAME}"), (method, path)
        ns = body["metadata"]["namespace"]
        if body["metadata"]["resourceVersion"] != str(self.secrets[ns][1]):
            raise ApiError(409, "Conflict", "the object has been modified")
        self.secrets[ns] = (base64.b64decode(body["data"]["keys"]).decode(), self.secrets[ns][1] + 1)
        self.puts.append(ns)
        return body

    def ring(self, ns: str) -> KeyRing:
        return parse_keyring(self.secrets[ns][0])


def rotator(api: FakeApi, now: float, namespaces: tuple[str, ...] = ("a", "b")) -> KeyRotator:
    settings = OperatorSettings(
        priority=1,
        namespaces=namespaces,
        tag_key_secret=NAME,
        tag_key_namespace="rel",
        tag_key_rotation_s=MIN_PERIOD_S,
    )
    return KeyRotator(api, settings, clock=lambda: now)  # type: ignore[arg-type]


def test_two_replicas_racing_rotate_once() -> None:
    api = FakeApi({"rel": K0.decode(), "a": K0.decode()})
    first, second = rotator(api, 1000.0), rotator(api, 1000.0)
    stale = api.get("v1", "secrets", "rel", NAME)  # what the second replica read before the first wrote
    assert first.tick() is not None
    ring = api.ring("rel")
    assert ring.previous == K0 and api.ring("a") == ring
    # the second replica replaces with the version it read: refused, nothing changes
    api.get = lambda *_a: stale  # type: ignore[method-assign]
    assert second.tick() is None
    assert api.ring("rel") == ring


def test_a_fresh_key_is_left_alone_an_old_one_rotated_and_a_missing_copy_not_created() -> None:
    fresh = render_keyring(KeyRing(b"1" * 32, K0, 5000.0))
    api = FakeApi({"rel": fresh, "a": fresh})
    assert rotator(api, 5000.0 + MIN_PERIOD_S - 1).tick() == fresh and api.puts == []
    assert rotator(api, 5000.0 + MIN_PERIOD_S).tick() is not None
    assert api.ring("rel").previous == b"1" * 32 and K0 not in api.ring("rel").verify_keys
    assert api.ring("a") == api.ring("rel") and "b" not in api.secrets
