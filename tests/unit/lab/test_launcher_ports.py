"""The local fleet's port picking: ports a child binds later must not be taken in between.

The launcher checks a port is free and hands its number to a child that binds it a moment later. A
port from the kernel's ephemeral range could be taken in between by any outgoing connection of any
process (clean-clone CI lost `slofleet up`'s engine-1 that way), so the launcher picks below it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from slo_lab.localfleet import launcher


def _range_file(tmp_path: Path, low: int, high: int) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{low}\t{high}\n")
    return path


def test_ports_are_below_the_ephemeral_range_bindable_and_never_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", _range_file(tmp_path, 40000, 60999))
    monkeypatch.setattr(launcher, "_handed_out", set())
    ports = [launcher.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(launcher._PICK_FLOOR <= p < 40000 for p in ports)
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_or_already_handed_out_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", _range_file(tmp_path, 40000, 60999))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]  # held by this test for the whole pick
        given, wanted = 21001, 21002
        monkeypatch.setattr(launcher, "_handed_out", {given})
        picks = iter([taken, given, wanted])
        monkeypatch.setattr(launcher._rng, "randrange", lambda lo, hi: next(picks))
        # the busy port lies in the ephemeral range here; the fake generator offers it anyway
        assert launcher.free_port() == wanted
    assert wanted in launcher._handed_out


def test_without_room_below_the_ephemeral_range_the_kernel_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", _range_file(tmp_path, 1024, 65535))
    port = launcher.free_port()
    assert 1024 <= port <= 65535
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert launcher._ephemeral_range() == (32768, 60999)
