"""A worker written from docs/protocol.md alone: it imports nothing from aiogc.

It speaks protocol version 5 over one plain TCP connection (§2.1 frames, §2.5 tags, §4 the
handshake and keys), checks the configuration's ``scheme_digest`` (§4.4), rebuilds the ``linreg``
task (§11) and serves the ``uncoded`` scheme (worker ``j`` holds chunk ``j``; its coded vector is
that chunk's gradient, §12), with only numpy, msgpack and cryptography.
``tests/test_independent_worker.py`` runs it beside aiogc's own workers against ``aiogc ps``.

    python tests/independent_worker.py --connect HOST:PORT --id J --secret-file FILE
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import select
import socket
import struct
import sys
import time
from typing import Any

import msgpack
import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = 5
#: §2.1: the kind codes
CHALLENGE, HELLO, WELCOME, READY, ROUND_START = 1, 2, 3, 4, 5
CODED_GRADIENT, ROUND_END, ERROR, SHUTDOWN, PING, PONG = 8, 10, 12, 13, 14, 15
DTYPE_CODE = {"float64": 8, "float32": 4}
DTYPES = {8: "<f8", 4: "<f4"}


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


class Conn:
    """Frames over one socket (§2.1), tagged once the session keys are known (§2.5)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.send_key: AESGCM | None = None
        self.recv_key: AESGCM | None = None
        self.send_seq = self.recv_seq = 0

    def send(self, values: list[Any]) -> None:
        body = msgpack.packb(values, use_bin_type=True)
        frame = struct.pack(">I", len(body)) + body
        if self.send_key is not None:
            frame += self.send_key.encrypt(struct.pack(">4xQ", self.send_seq), b"", frame)
            self.send_seq += 1
        self.sock.sendall(frame)

    def _take(self, n: int, deadline: float) -> bytes | None:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the PS closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self, deadline: float) -> list[Any] | None:
        """The next frame's array (``[5, kind, fields...]``), or None at ``deadline``."""
        if len(self.buf) < 4 and self._peek(4, deadline) is None:
            return None
        (size,) = struct.unpack(">I", self.buf[:4])
        tag = 16 if self.recv_key is not None else 0
        if self._peek(4 + size + tag, deadline) is None:
            return None
        frame = self._take(4 + size, deadline)
        assert frame is not None
        if self.recv_key is not None:
            mac = self._take(16, deadline)
            assert mac is not None
            # GMAC: decrypting the tag of an empty plaintext verifies it (InvalidTag otherwise)
            self.recv_key.decrypt(struct.pack(">4xQ", self.recv_seq), mac, frame)
            self.recv_seq += 1
        obj = msgpack.unpackb(frame[4:])
        if not isinstance(obj, list) or obj[:1] != [VERSION]:
            raise ValueError(f"not a version-{VERSION} frame: {obj!r:.80}")
        return obj

    def _peek(self, n: int, deadline: float) -> bytes | None:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the PS closed the connection")
            self.buf += chunk
        return self.buf[:n]


def scheme_digest_uncoded(m: int) -> str:
    """§4.4 for ``uncoded``: A = I, orders [j], E = the identity of shape (m, m, 1)."""
    h = hashlib.sha256(b"uncoded")
    h.update(np.eye(m, dtype=np.uint8).tobytes())
    for j in range(m):
        h.update(np.array([j], dtype="<i8").tobytes() + b"|")
    h.update(b"E" + np.eye(m, dtype="<f8").reshape(m, m, 1).tobytes())
    return h.hexdigest()[:32]


def linreg_chunk(task: str, n_chunks: int, seed: int,
                 i: int) -> tuple[np.ndarray, np.ndarray, int]:
    """§11: chunk ``i``'s rows (X_i, y_i) of the shuffled data, and the sample count."""
    params = {"samples": 2000, "dim": 50, "noise": 0.1}
    name, _, spec = task.partition(":")
    if name != "linreg":
        raise ValueError(f"task {task!r}: only linreg is built here")
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        params[key] = float(value) if key == "noise" else int(value)
    samples, dim = int(params["samples"]), int(params["dim"])
    data_ss, shuffle_ss = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(data_ss)
    x = rng.standard_normal((samples, dim))
    w_true = rng.standard_normal(dim)
    y = x @ w_true + params["noise"] * rng.standard_normal(samples)
    perm = np.random.default_rng(int(shuffle_ss.generate_state(1)[0])).permutation(samples)
    x, y = x[perm], y[perm]
    lo, hi = i * samples // n_chunks, (i + 1) * samples // n_chunks
    return x[lo:hi], y[lo:hi], samples


def handshake(conn: Conn, j: int, secret: bytes) -> tuple[int, dict[str, Any]]:
    """§4.1-§4.2: challenge, hello, welcome checked, session keys on; (epoch, config)."""
    far = time.monotonic() + 10.0
    challenge = conn.recv(far)
    assert challenge is not None and challenge[1] == CHALLENGE, challenge
    nonce_ps, epoch = challenge[2], challenge[3]
    k_j = _hmac(secret, b"aiogc/2 worker-key" + struct.pack(">I", j))
    nonce_w = os.urandom(16)
    ids = struct.pack(">I", j) + struct.pack(">Q", epoch)
    conn.send([VERSION, HELLO, j, nonce_w,
               _hmac(k_j, b"aiogc/2 hello" + nonce_ps + nonce_w + ids), epoch])
    welcome = conn.recv(far)
    assert welcome is not None and welcome[1] == WELCOME, welcome
    _, _, w_epoch, w_worker, mac, config = welcome
    canonical = msgpack.packb({k: config[k] for k in sorted(config)}, use_bin_type=True)
    expect = _hmac(k_j, b"aiogc/2 welcome" + nonce_ps + nonce_w + ids
                   + hashlib.sha256(canonical).digest())
    if (w_epoch, w_worker) != (epoch, j) or not hmac.compare_digest(mac, expect):
        raise ValueError("welcome does not verify")
    session = _hmac(k_j, b"aiogc/2 session" + nonce_ps + nonce_w + struct.pack(">QI", epoch, j))
    conn.recv_key = AESGCM(_hmac(session, b"ps->worker"))
    conn.send_key = AESGCM(_hmac(session, b"worker->ps"))
    return epoch, config


def run(host: str, port: int, j: int, secret: bytes) -> int:
    conn = Conn(socket.create_connection((host, port), timeout=10))
    epoch, config = handshake(conn, j, secret)
    m = config["workers"]
    if config["scheme"] != "uncoded" or config["scheme_digest"] != scheme_digest_uncoded(m):
        raise ValueError(f"scheme {config['scheme']}: digest {config['scheme_digest']} "
                         f"is not uncoded's for m={m}")
    x, y, samples = linreg_chunk(config["task"], m, config["seed"], j)
    digest = hashlib.blake2b(np.eye(m, dtype="<i8")[j].tobytes(), digest_size=8).digest()
    out_dtype = config["dtype"]
    conn.send([VERSION, READY, epoch])
    heartbeat = config["heartbeat_s"] or 3600.0
    last_sent, seq = time.monotonic(), 0
    pending: tuple[float, list[Any]] | None = None  # (when, frame) of the coded vector
    while True:
        now = time.monotonic()
        if pending is not None and now >= pending[0]:
            conn.send(pending[1])
            pending, last_sent = None, now
            continue
        wake = min(last_sent + heartbeat, pending[0] if pending else now + heartbeat)
        msg = conn.recv(wake)
        if msg is None:
            if time.monotonic() >= last_sent + heartbeat:
                seq += 1
                conn.send([VERSION, PING, seq])
                last_sent = time.monotonic()
            continue
        kind = msg[1]
        if kind == ROUND_START:
            _, _, r_epoch, rnd, delays, net_delay, _orders, dcode, model = msg
            t0 = time.monotonic()
            w = np.frombuffer(model, DTYPES[dcode]).astype(np.float64)
            grad = x.T @ (x @ w - y) / samples  # §11: X_i^T (X_i w - y_i) / samples
            payload = grad.astype(np.dtype(DTYPES[DTYPE_CODE[out_dtype]])).tobytes()
            compute_s = float(delays[0]) if delays else 0.0
            frame = [VERSION, CODED_GRADIENT, r_epoch, rnd, 0, digest, compute_s,
                     DTYPE_CODE[out_dtype], payload]
            pending = (t0 + compute_s + float(net_delay), frame)
        elif kind == ROUND_END:
            pending = None
        elif kind == PING:
            conn.send([VERSION, PONG, msg[2]])
            last_sent = time.monotonic()
        elif kind == SHUTDOWN:
            print(f"independent worker {j}: shutdown: {msg[2]}", file=sys.stderr)
            conn.sock.close()
            return 0
        elif kind == ERROR:
            raise ConnectionError(f"error from the PS: {msg[2]}: {msg[3]}")
        elif kind != PONG:
            raise ValueError(f"unexpected kind {kind}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connect", required=True)
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--secret-file", required=True)
    a = ap.parse_args()
    host, _, port = a.connect.rpartition(":")
    with open(a.secret_file, "rb") as f:
        secret = f.read().strip()
    return run(host, int(port), a.id, secret)


if __name__ == "__main__":
    sys.exit(main())
