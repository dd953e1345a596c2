"""``python -m aiogc`` = the ``aiogc`` command."""

from aiogc.cli import main

raise SystemExit(main())
