"""Rotation of the tag-key Secret (``slo_core.wire.keyring``): the operator owns it.

Why the operator and not a chart CronJob: it already runs, holds the API credentials and the list of
namespaces it manages, and a rotation must reach every copy of the Secret in one step (the router
signs in the release namespace, engine pods verify in theirs); a CronJob would be one more image,
ServiceAccount and schedule to keep in step with the operator's view of the namespaces.

Every ``check_s`` the operator reads the Secret in its own namespace (the source); when its current
key is older than the period (or of unknown age: a Secret made by hand or by the chart) it writes a
new ring (new current, old current as previous, the older one dropped) with an update that carries
the resourceVersion it read, so two replicas never both rotate (the loser gets 409 and re-reads next
time). Then every copy in the managed namespaces that differs is overwritten with the source's ring,
at once, so all pods see the same ring within the kubelet's propagation time, which the signers'
settle time covers. Copies are never created here (that needs create on every Secret): a missing one
is logged. Pods follow the mounted files live; nothing restarts.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from slo_core.wire.k8s import API_GROUP, API_VERSION
from slo_core.wire.keyring import parse_keyring, render_keyring, rotate, rotation_due
from slo_operator.kubeapi import ApiError, KubeApi, path
from slo_operator.model import MD_PLURAL
from slo_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

DATA_KEY = "keys"


def _text(secret: dict[str, Any]) -> str | None:
    raw = (secret.get("data") or {}).get(DATA_KEY)
    return base64.b64decode(raw).decode() if raw else None


class KeyRotator:
    """One pass (:meth:`tick`) rotates the source Secret when due and brings every copy in line."""

    def __init__(
        self, api: KubeApi, settings: OperatorSettings, clock: Callable[[], float] = time.time
    ) -> None:
        if not (settings.tag_key_secret and settings.tag_key_namespace):
            raise ValueError("key rotation needs tag_key_secret and tag_key_namespace")
        self.api, self.settings, self.clock = api, settings, clock
        self.name: str = settings.tag_key_secret
        self.source: str = settings.tag_key_namespace
        self._missing: set[str] = set()

    def _put(self, secret: dict[str, Any], text: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.name,
                "namespace": secret["metadata"]["namespace"],
                "resourceVersion": secret["metadata"]["resourceVersion"],
                "labels": secret["metadata"].get("labels") or {},
                "annotations": secret["metadata"].get("annotations") or {},
            },
            "type": secret.get("type", "Opaque"),
            "data": {**(secret.get("data") or {}), DATA_KEY: base64.b64encode(text.encode()).decode()},
        }
        self.api.request("PUT", path("v1", "secrets", body["metadata"]["namespace"], self.name), body)

    def namespaces(self) -> list[str]:
        """Where copies live: the namespaces the operator manages, else those holding ModelDeployments."""
        if self.settings.namespaces:
            found: Iterable[str] = self.settings.namespaces
        else:
            listed = self.api.request("GET", path(f"{API_GROUP}/{API_VERSION}", MD_PLURAL, None))
            found = {item["metadata"]["namespace"] for item in listed.get("items", [])}
        return sorted(set(found) - {self.source})

    def tick(self) -> str | None:
        """Rotate if due and sync the copies; returns the source ring's text (None: no usable source)."""
        secret = self.api.get("v1", "secrets", self.source, self.name)
        text = _text(secret) if secret else None
        if secret is None or text is None:
            log.error("tag-key Secret %s/%s missing or empty: not rotated", self.source, self.name)
            return None
        try:
            ring = parse_keyring(text)
        except ValueError as exc:
            log.error("tag-key Secret %s/%s unusable (%s): not rotated", self.source, self.name, exc)
            return None
        now = self.clock()
        if rotation_due(ring, now, self.settings.tag_key_rotation_s):
            new_text = render_keyring(rotate(ring, now))
            try:
                self._put(secret, new_text)
            except ApiError as err:
                if err.code == 409:  # another replica rotated first: its ring wins, read next time
                    log.info("tag-key Secret changed under the rotation: read again next time")
                    return None
                raise
            log.info("tag-key Secret %s/%s rotated (the previous key stays valid)", self.source, self.name)
            text = new_text
        for ns in self.namespaces():
            self._sync(ns, text)
        return text

    def _sync(self, namespace: str, text: str) -> None:
        copy = self.api.get("v1", "secrets", namespace, self.name)
        if copy is None:
            if namespace not in self._missing:
                log.warning("no tag-key Secret %s/%s: its engine pods cannot start", namespace, self.name)
                self._missing.add(namespace)
            return
        self._missing.discard(namespace)
        if _text(copy) != text:
            try:
                self._put(copy, text)
            except ApiError as err:
                if err.code != 409:
                    raise
                return  # changed meanwhile: synced next time
            log.info("tag-key Secret %s/%s now matches %s", namespace, self.name, self.source)


async def rotate_forever(rotator: KeyRotator, check_s: float) -> None:
    """The operator's background job: a pass every ``check_s``; an API error is retried next time."""
    while True:
        try:
            await asyncio.to_thread(rotator.tick)
        except ApiError as err:
            log.warning("tag-key rotation: %s (retrying in %.0f s)", err, check_s)
        except Exception:  # a background job never dies silently: say why, try again next time
            log.exception("tag-key rotation failed (retrying in %.0f s)", check_s)
        await asyncio.sleep(check_s)
