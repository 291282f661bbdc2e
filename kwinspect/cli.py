"""The kwinspect command line (being wired up; see docs/cli.md)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("kwinspect: the command line is being wired up", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
