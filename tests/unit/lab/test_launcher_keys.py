"""The local fleet's tag-signing key: created for the fleet's processes, gone when they stop."""

from __future__ import annotations

from pathlib import Path

from slo_lab.localfleet import launcher
from slo_lab.localfleet.spec import FleetSpec


def test_the_fleets_tag_key_lives_only_while_the_fleet_runs(tmp_path: Path) -> None:
    """The demo keeps each fleet's workdir in its report folder for the logs; the signing key, a
    secret, must not outlive the processes that read it (earlier reports committed it)."""
    fleet = launcher.LocalFleet(FleetSpec(port=0, workdir=tmp_path / "fleet"))
    key = fleet.tag_key_file
    assert key is not None and key.exists()
    assert key.stat().st_mode & 0o777 == 0o600
    fleet.stop()  # no child was started: stop still takes the key away
    assert not key.exists()
    assert (tmp_path / "fleet" / "logs").is_dir()  # what the report keeps is still there
    fleet.stop()  # twice is fine
