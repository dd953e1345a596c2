"""Sans-IO protocol core: the parameter server and worker state machines.

No asyncio, sockets, clocks or global randomness here (a test enforces it); drivers in
``aiogc.net`` (asyncio TCP) and ``aiogc.sim`` (virtual clock) feed the same objects.
"""

from .common import (
    ChunkComputed,
    CodedSent,
    ConnectionFailed,
    Event,
    Finished,
    Outgoing,
    PeerClosed,
    RoundCompleted,
    RoundEnded,
    RoundRecord,
    RoundResumed,
    RoundStarted,
    ShutdownRequested,
    Triggered,
    Welcomed,
    WorkerDropped,
    WorkerJoined,
)
from .ps import ParameterServer, PSPhase
from .worker import PS_PEER, Setup, Worker, WorkerPhase, default_setup

__all__ = [
    "PS_PEER",
    "ChunkComputed",
    "CodedSent",
    "ConnectionFailed",
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
    "Setup",
    "ShutdownRequested",
    "Triggered",
    "Welcomed",
    "Worker",
    "WorkerDropped",
    "WorkerJoined",
    "WorkerPhase",
    "default_setup",
]
