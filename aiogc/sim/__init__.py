"""Simulation: the protocol core on a virtual clock, and a vectorised fast path.

* :mod:`aiogc.sim.engine` -- :class:`Simulation`, the virtual-clock driver of the core.
* :mod:`aiogc.sim.protocol` -- :func:`simulate_protocol`: PS + m workers per scheme, one shared
  delay schedule, per-round records.
* :mod:`aiogc.sim.fast` -- :func:`simulate_fast`: the same outcomes in closed form, vectorised
  over trials (agrees with the protocol engine trial by trial; tests/test_sim.py).
* :mod:`aiogc.cli.simulate` -- ``aiogc simulate`` and ``aiogc experiment``.
"""

from aiogc.sim.engine import Simulation
from aiogc.sim.fast import FastResult, gaussian_chunk_gradients, simulate_fast
from aiogc.sim.protocol import record_arrays, simulate_protocol, simulation_config

__all__ = [
    "FastResult",
    "Simulation",
    "gaussian_chunk_gradients",
    "record_arrays",
    "simulate_fast",
    "simulate_protocol",
    "simulation_config",
]
