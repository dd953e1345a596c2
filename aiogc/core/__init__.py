"""Sans-IO protocol core: the parameter server and worker state machines.

No asyncio, sockets, clocks or global randomness here (a test enforces it); drivers in
``aiogc.net`` (asyncio TCP) and ``aiogc.sim`` (virtual clock) feed the same objects.
"""

from aiogc.core.common import (
    AUTH_DEADLINE_S,
    FATAL_CODES,
    ChunkComputed,
    CodedSent,
    ComputeChunks,
    ConnectionFailed,
    DuplicateWorker,
    EncodeVector,
    Event,
    Finished,
    Outgoing,
    PeerClosed,
    RoundCompleted,
    RoundEnded,
    RoundRecord,
    RoundResumed,
    RoundStarted,
    SetupNeeded,
    ShutdownRequested,
    Triggered,
    Welcomed,
    WorkerDropped,
    WorkerEvicted,
    WorkerJoined,
)
from aiogc.core.ps import ParameterServer, PSOptions, PSPhase
from aiogc.core.ps_work import AnalyseRound, Decoded, DecodeRound
from aiogc.core.worker import PS_PEER, Setup, Worker, WorkerCache, WorkerPhase

__all__ = [
    "AUTH_DEADLINE_S",
    "FATAL_CODES",
    "PS_PEER",
    "AnalyseRound",
    "ChunkComputed",
    "CodedSent",
    "ComputeChunks",
    "ConnectionFailed",
    "DecodeRound",
    "Decoded",
    "DuplicateWorker",
    "EncodeVector",
    "Event",
    "Finished",
    "Outgoing",
    "PSOptions",
    "PSPhase",
    "ParameterServer",
    "PeerClosed",
    "RoundCompleted",
    "RoundEnded",
    "RoundRecord",
    "RoundResumed",
    "RoundStarted",
    "Setup",
    "SetupNeeded",
    "ShutdownRequested",
    "Triggered",
    "Welcomed",
    "Worker",
    "WorkerCache",
    "WorkerDropped",
    "WorkerEvicted",
    "WorkerJoined",
    "WorkerPhase",
]
