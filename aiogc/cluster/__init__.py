"""Running beyond one machine.

:mod:`aiogc.cluster.ray_backend` places the PS and the workers as Ray actors
(``aiogc run --backend ray``); Ray only places and supervises the processes, the PS and workers
speak aiogc's own TCP protocol to each other. Importing this package does not import Ray.
"""

from __future__ import annotations

__all__ = ["BACKENDS"]

#: Values of ``aiogc run --backend``.
BACKENDS = ("local", "ray")
