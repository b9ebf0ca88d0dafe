"""The tag-key ring: current + previous, rotation, the settle time before a new key signs, live reload
of the mounted Secret file, and a fleet-wide rotation simulation in which no in-flight signature is
ever refused (while one made with a key older than the previous one always is)."""

from __future__ import annotations

import os
import random
from collections import deque
from pathlib import Path

import pytest

from slo_core.wire.callauth import STATE_WATCH, call_token, check_call_token
from slo_core.wire.keyring import (
    MIN_PERIOD_S,
    SETTLE_S,
    KeyFile,
    KeyRing,
    parse_keyring,
    render_keyring,
    rotate,
    rotation_due,
)
from slo_core.wire.signing import MAX_AGE_S, parse_keys, sign, verify

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32
TAGS = {"slo_kind": "deadline", "slo_deadline_s": 10.0}


def test_the_file_round_trips_and_a_key_older_than_previous_is_ignored() -> None:
    ring = KeyRing(B, A, 1000.0)
    assert parse_keyring(render_keyring(ring)) == ring
    assert parse_keyring(f"{C.decode()}\n{B.decode()}\n{A.decode()}\n").verify_keys == (C, B)
    assert parse_keys(f"{C.decode()}\n{B.decode()}\n{A.decode()}\n") == [C, B]
    assert parse_keyring(A.decode()) == KeyRing(A)  # a hand-made Secret: one key, no time
    for bad in [
        "",
        "rotated-at=1000\n",
        "short\n",
        "rotated-at=x\n" + A.decode(),
        "rotated-at=inf\n" + A.decode(),
    ]:
        with pytest.raises(ValueError):
            parse_keyring(bad)


def test_rotation_makes_current_previous_drops_the_older_and_signs_new_only_after_settling() -> None:
    ring = rotate(rotate(KeyRing(A), 1000.0, B), 5000.0, C)
    assert ring == KeyRing(C, B, 5000.0)
    assert A not in ring.verify_keys
    assert ring.signing_key(5000.0 + SETTLE_S - 1) == B
    assert ring.signing_key(5000.0 + SETTLE_S) == C
    assert KeyRing(A).signing_key(0.0) == A
    assert not rotation_due(ring, 5000.0 + 3599, 3600.0)
    assert rotation_due(ring, 5000.0 + 3600, 3600.0)
    assert rotation_due(KeyRing(A), 0.0, 3600.0), "a hand-made key of unknown age is rotated at once"


def secret_swap(path: Path, text: str) -> None:
    """What the kubelet does to a Secret volume: write elsewhere, swap atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_the_key_file_follows_the_mounted_secret_and_keeps_the_last_good_ring(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(render_keyring(KeyRing(A)))
    now = [0.0]
    kf = KeyFile(path, check_s=1.0, clock=lambda: now[0])
    assert kf() == KeyRing(A)
    secret_swap(path, render_keyring(KeyRing(B, A, 100.0)))
    assert kf() == KeyRing(A), "not re-checked before check_s"
    now[0] = 1.0
    assert kf() == KeyRing(B, A, 100.0) and kf.reloads == 1
    secret_swap(path, "short\n")
    now[0] = 2.0
    assert kf() == KeyRing(B, A, 100.0), "a bad edit keeps the keys read before"
    path.unlink()
    now[0] = 3.0
    assert kf() == KeyRing(B, A, 100.0)


class Mount:
    """One process's view of the Secret: its own mounted file, updated ``delay_s`` after each write."""

    def __init__(self, root: Path, name: str, delay_s: float, clock: list[float]) -> None:
        self.path = root / name
        self.delay_s = delay_s
        self.pending: list[tuple[float, str]] = []
        self.path.write_text(render_keyring(KeyRing(A)))
        self.keys = KeyFile(self.path, check_s=1.0, clock=lambda: clock[0])

    def tick(self, now_s: float) -> None:
        while self.pending and self.pending[0][0] <= now_s:
            secret_swap(self.path, self.pending.pop(0)[1])


def simulate(tmp_path: Path, settle_s: float, seed: int) -> tuple[int, int]:
    """Several rotations at the shortest period; signers (sidecars signing tags, routers making call
    tokens) and verifiers (plugins, sidecars' gRPC) see each write up to 120 s late, each at its own
    moment. Every signature made is checked by every verifier at once and again just before it goes
    stale. Returns (signatures checked, refusals)."""
    rng = random.Random(seed)
    clock = [0.0]
    signers = [Mount(tmp_path, f"s{i}", rng.uniform(0, 120), clock) for i in range(4)]
    verifiers = [Mount(tmp_path, f"v{i}", rng.uniform(0, 120), clock) for i in range(4)]
    secret = KeyRing(A)
    lags = (0.0, MAX_AGE_S - 10.0)
    in_flight: dict[float, deque[tuple[float, float, dict[str, object], str]]] = {
        lag: deque() for lag in lags
    }
    checked = refused = 0
    step_s, end_s = 10.0, 3 * MIN_PERIOD_S + 1000
    next_rotation = 100.0
    while clock[0] < end_s:
        now = clock[0]
        if now >= next_rotation:
            secret = rotate(secret, now, f"{rng.getrandbits(128):032x}".encode())
            for m in signers + verifiers:
                m.pending.append((now + m.delay_s, render_keyring(secret)))
            next_rotation += MIN_PERIOD_S
        for m in signers + verifiers:
            m.tick(now)
        for s in signers:
            key = s.keys().signing_key(now, settle_s)
            signed = sign(TAGS, key, now)
            token = call_token(key, STATE_WATCH, now)
            for lag in lags:
                in_flight[lag].append((now + lag, now, signed, token))
        due = []
        for queue in in_flight.values():
            while queue and queue[0][0] <= now:
                due.append(queue.popleft())
        for _, made_s, signed, token in due:
            for v in verifiers:
                checked += 1
                keys = v.keys().verify_keys
                if verify(signed, keys, now) is not None:
                    refused += 1
                if now - made_s <= 60 and check_call_token(token, STATE_WATCH, keys, now) is not None:
                    refused += 1
        clock[0] += step_s
    return checked, refused


@pytest.mark.parametrize("seed", [1, 2])
def test_rotating_under_load_never_refuses_a_signature_in_flight(tmp_path: Path, seed: int) -> None:
    checked, refused = simulate(tmp_path, SETTLE_S, seed)
    assert checked > 5_000 and refused == 0


def test_signing_with_a_new_key_at_once_would_demote_requests(tmp_path: Path) -> None:
    """The settle time is what makes rotation safe: without it verifiers that have not yet seen the new
    key refuse (best-effort) what the first pods to see it sign."""
    _, refused = simulate(tmp_path, 0.0, 1)
    assert refused > 0


def test_a_key_older_than_previous_is_refused_after_two_rotations() -> None:
    ring = rotate(rotate(KeyRing(A), 1000.0, B), 1000.0 + MIN_PERIOD_S, C)
    now = 1000.0 + MIN_PERIOD_S + 1
    assert verify(sign(TAGS, A, now), ring.verify_keys, now) == "forged signature"
    assert verify(sign(TAGS, B, now), ring.verify_keys, now) is None
    assert (
        check_call_token(call_token(A, STATE_WATCH, now), STATE_WATCH, ring.verify_keys, now) == "wrong key"
    )
