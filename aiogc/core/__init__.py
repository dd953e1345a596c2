"""Sans-IO protocol core: the parameter server and worker state machines.

No asyncio, sockets, clocks or global randomness here (a test enforces it); drivers in
``aiogc.net`` (asyncio TCP) and ``aiogc.sim`` (virtual clock) feed the same objects.
"""

from .common import (
    AUTH_DEADLINE_S,
    FATAL_CODES,
    ChunkComputed,
    CodedSent,
    ComputeChunks,
    ConnectionFailed,
    DuplicateWorker,
    Event,
    Finished,
    Outgoing,
    PeerClosed,
    RoundCompleted,
    RoundEnded,
    RoundRecord,
    RoundResumed,
    RoundStarted,
    SessionKeys,
    SetupNeeded,
    ShutdownRequested,
    Triggered,
    Welcomed,
    WorkerDropped,
    WorkerJoined,
    derive_worker_key,
)
from .ps import ParameterServer, PSPhase
from .worker import PS_PEER, Setup, Worker, WorkerPhase

__all__ = [
    "AUTH_DEADLINE_S",
    "FATAL_CODES",
    "PS_PEER",
    "ChunkComputed",
    "CodedSent",
    "ComputeChunks",
    "ConnectionFailed",
    "DuplicateWorker",
    "Event",
    "Finished",
    "Outgoing",
    "PSPhase",
    "ParameterServer",
    "PeerClosed",
    "RoundCompleted",
    "RoundEnded",
    "RoundRecord",
    "RoundResumed",
    "RoundStarted",
    "SessionKeys",
    "Setup",
    "SetupNeeded",
    "ShutdownRequested",
    "Triggered",
    "Welcomed",
    "Worker",
    "WorkerDropped",
    "WorkerJoined",
    "WorkerPhase",
    "derive_worker_key",
]
