"""``python -m aiogc`` = the ``aiogc`` command."""

from .cli import main

raise SystemExit(main())
