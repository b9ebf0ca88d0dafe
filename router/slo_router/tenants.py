"""Tenants, their API keys and tier binding.

Keys are kept only as SHA-256 digests and compared by digest, so a key never sits in memory in a
form that could end up in a log line or a debug dump. A tenant is allowed a set of tiers and has a
default; a request may ask for an allowed tier, never another: a tier (or any other privilege) the
tenant is not allowed is stripped, counted, and the default applies.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    allowed_tiers: tuple[str, ...]
    default_tier: str
    requests_per_s: float | None = None
    tokens_per_s: float | None = None

    def bind_tier(self, asked: str | None) -> tuple[str, bool]:
        """The tier this request gets, and whether what it asked for was stripped."""
        if asked is None or asked == self.default_tier:
            return self.default_tier, False
        if asked in self.allowed_tiers:
            return asked, False
        return self.default_tier, True


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyStore:
    """Maps API keys (by digest) to tenant names; reloadable as a whole."""

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self._by_digest: dict[str, str] = {}
        if keys:
            self.replace(keys)

    def replace(self, keys: Mapping[str, str]) -> None:
        """Swap in a new key → tenant map (e.g. after a Secret changed)."""
        self._by_digest = {key_digest(k): tenant for k, tenant in keys.items() if k}

    def replace_digests(self, digests: Mapping[str, str]) -> None:
        self._by_digest = dict(digests)

    def tenant_of(self, key: str) -> str | None:
        digest = key_digest(key)
        for known, tenant in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return None

    def __len__(self) -> int:
        return len(self._by_digest)


def parse_keys(doc: object, source: str) -> dict[str, str]:
    """Read ``{"tenants": {name: [key, ...]}}`` (a local keys file) into key → tenant."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("tenants"), Mapping):
        raise ValueError(f"{source}: expected a mapping 'tenants: {{NAME: [KEY, ...]}}'")
    out: dict[str, str] = {}
    for tenant, keys in doc["tenants"].items():
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"{source}: tenants.{tenant} must be a list of non-empty key strings")
        for k in keys:
            if k in out and out[k] != tenant:
                raise ValueError(f"{source}: one key is listed under two tenants ({out[k]!r}, {tenant!r})")
            out[k] = str(tenant)
    return out


def load_keys_file(path: str | Path) -> dict[str, str]:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read keys file {p}: {exc}") from None
    return parse_keys(doc, str(p))


def keys_from_secret_data(tenant: str, values: Iterable[str]) -> dict[str, str]:
    """Keys from a Kubernetes Secret's decoded values: each value holds one key per line."""
    out: dict[str, str] = {}
    for value in values:
        for line in value.splitlines():
            key = line.strip()
            if key and not key.startswith("#"):
                out[key] = tenant
    return out
