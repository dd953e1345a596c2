"""``python -m aiogc`` and the ``aiogc`` command.

:func:`main` answers ``aiogc --version`` from :mod:`aiogc._version` alone (no numpy, no scipy:
the answer is instant), and hands everything else to :func:`aiogc.cli.main`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        from aiogc._version import __version__

        print(f"aiogc {__version__}")
        return 0
    from aiogc.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
