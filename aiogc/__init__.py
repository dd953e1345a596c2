"""aiogc: gradient coding that leverages partial stragglers.

Layers (each imports only those below it): ``coding`` (numpy/scipy math) -> ``core`` (sans-IO
state machines) and ``messages``/``wire`` -> ``sim`` (virtual clock) and ``net`` (asyncio TCP)
-> ``runner`` / ``cli``.
"""

__version__ = "0.1.0"
