"""`python -m sessions_server`: the `sessions-server` command, for a Python without the console script on PATH."""

from __future__ import annotations

import sys

from sessions_server.cli import main

if __name__ == "__main__":
    sys.exit(main())
