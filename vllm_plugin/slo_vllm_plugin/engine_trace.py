"""Engine-side trace: a JSON line per arrival, admission, preemption, rejection, finish and decision."""

from __future__ import annotations

import json
import threading
import time
from typing import IO, Any


class EngineTrace:
    """Append-only JSONL writer; a no-op when no path is configured."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[str] | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def event(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        line = json.dumps({"t": time.time(), "event": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
