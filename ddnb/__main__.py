"""The `ddnb` command (console script, or `python -m ddnb`):

    ddnb bench allreduce --workers 4 --sizes 4KB..64MB --fit

Each command is a module with its own `main(argv, prog)`; this only dispatches to it.
Used in `notebooks/05_allreduce.ipynb` and `notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {"bench": ("ddnb.bench.__main__", "benchmarks: allreduce, alltoall (time, algbw, busbw per size), "
                                             "dp (step time per strategy)")}


def _usage() -> str:
    lines = ["usage: ddnb COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines + ["", "ddnb COMMAND --help for its arguments"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] not in COMMANDS:
        print(f"{_usage()}\n\nddnb: error: unknown command {argv[0]!r}; known: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:], prog=f"ddnb {argv[0]}")


if __name__ == "__main__":
    sys.exit(main())
