"""Safe persistence of the length forest: an ``.npz`` of plain arrays plus a SHA-256 recorded at training.

No pickle anywhere: arrays load with ``allow_pickle=False`` and the metadata is JSON. On top of that
the file's SHA-256 is written next to it (``<file>.sha256``) when it is trained, and loading refuses a
file whose bytes do not match (a swapped or corrupted artefact never gets used). The bytes that were
hashed are the bytes that get parsed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FORMAT = "slofleet-qrf/1"
HASH_SUFFIX = ".sha256"


class ArtefactError(ValueError):
    """The artefact is missing its hash, fails verification, or is malformed."""


def hash_path(path: Path) -> Path:
    return path.with_name(path.name + HASH_SUFFIX)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save(path: Path, arrays: dict[str, npt.NDArray[np.generic]], meta: dict[str, Any]) -> str:
    """Write arrays + JSON metadata atomically, then the hash file; returns the SHA-256 hex digest."""
    buf = io.BytesIO()
    meta_bytes = json.dumps({"format": FORMAT, **meta}, sort_keys=True).encode("utf-8")
    contents: dict[str, Any] = {**arrays, "meta_json": np.frombuffer(meta_bytes, dtype=np.uint8)}
    np.savez_compressed(buf, **contents)
    data = buf.getvalue()
    digest = sha256_hex(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, payload in ((path, data), (hash_path(path), f"{digest}  {path.name}\n".encode())):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{target.name}.")
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.chmod(tmp, 0o644)
        Path(tmp).replace(target)
    return digest


def recorded_hash(path: Path) -> str:
    """The digest written at training time next to ``path``."""
    try:
        text = hash_path(path).read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError) as exc:
        raise ArtefactError(f"no valid hash file {hash_path(path)}; refusing to load {path}") from exc
    digest = text.split()[0].lower() if text else ""
    if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
        raise ArtefactError(f"malformed hash file {hash_path(path)}")
    return digest


def load(
    path: Path, expected_sha256: str | None = None
) -> tuple[dict[str, npt.NDArray[np.generic]], dict[str, Any]]:
    """Verify then parse an artefact: (arrays, metadata). ``expected_sha256`` overrides the hash file."""
    expected = (expected_sha256 or recorded_hash(path)).lower()
    data = path.read_bytes()
    actual = sha256_hex(data)
    if actual != expected:
        raise ArtefactError(
            f"{path}: SHA-256 {actual[:16]}… does not match the recorded {expected[:16]}…; refusing to load"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        meta = json.loads(bytes(arrays.pop("meta_json").astype(np.uint8)).decode("utf-8"))
    except (ValueError, KeyError, OSError) as exc:
        raise ArtefactError(f"{path}: not a readable artefact ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArtefactError(
            f"{path}: unknown artefact format {meta.get('format') if isinstance(meta, dict) else meta!r}"
        )
    return arrays, meta
