"""Authentication (protocol version 2+, docs/protocol.md "Authentication"): per-worker keys
derived from the master secret, the handshake MACs, the welcome config hash and the
per-connection session keys. Pure functions of bytes; no state."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import msgpack


def _u32(x: int) -> bytes:
    return int(x).to_bytes(4, "big")


def _u64(x: int) -> bytes:
    return int(x).to_bytes(8, "big")


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def derive_worker_key(secret: bytes, worker: int) -> bytes:
    """k_j = HMAC-SHA256(S, "aiogc/2 worker-key" || u32be(j)): 32 bytes."""
    return _hmac(secret, b"aiogc/2 worker-key" + _u32(worker))


def hello_mac(key: bytes, ps_nonce: bytes, worker_nonce: bytes, worker: int, epoch: int) -> bytes:
    """MAC a worker sends in ``hello`` under its key k_j."""
    return _hmac(key, b"aiogc/2 hello" + ps_nonce + worker_nonce + _u32(worker) + _u64(epoch))


def welcome_mac(key: bytes, ps_nonce: bytes, worker_nonce: bytes, worker: int, epoch: int,
                config_hash: bytes) -> bytes:
    """MAC the PS sends in ``welcome``: proves it knows k_j and binds the configuration."""
    return _hmac(key, b"aiogc/2 welcome" + ps_nonce + worker_nonce + _u32(worker) + _u64(epoch)
                 + config_hash)


def config_hash(config: dict[str, Any]) -> bytes:
    """SHA-256 of the canonical bytes of a welcome config map.

    Canonical bytes: msgpack of the map with its keys in sorted order (ints in their shortest
    form, floats as float64, ``use_bin_type``), i.e. the bytes a sorted-key re-encoding of
    the decoded map gives, whoever encoded it first.
    """
    canonical = msgpack.packb({k: config[k] for k in sorted(config)}, use_bin_type=True)
    return hashlib.sha256(canonical).digest()


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """Per-connection GMAC keys: ``ps_to_worker`` tags PS frames, ``worker_to_ps`` the others."""

    ps_to_worker: bytes
    worker_to_ps: bytes


def session_keys(key: bytes, ps_nonce: bytes, worker_nonce: bytes, epoch: int,
                 worker: int) -> SessionKeys:
    """K = HMAC(k_j, "aiogc/2 session" || nonce_ps || nonce_w || u64be(epoch) || u32be(j));
    K_ps = HMAC(K, "ps->worker"), K_w = HMAC(K, "worker->ps")."""
    k = _hmac(key, b"aiogc/2 session" + ps_nonce + worker_nonce + _u64(epoch) + _u32(worker))
    return SessionKeys(_hmac(k, b"ps->worker"), _hmac(k, b"worker->ps"))


def macs_equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a, b)


