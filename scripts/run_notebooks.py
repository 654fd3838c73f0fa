"""Run notebooks top to bottom and store their outputs in place (what nbval compares).

    python scripts/run_notebooks.py notebooks/00_getting_started.ipynb [...]

Each runs in its own folder with the python3 kernel of this environment, one at a time; a
cell that raises stops it with the error, and the notebook is not rewritten.

Stored outputs are what a reader sees, so they must come from a quiet machine. Before each
notebook this waits (up to --wait seconds) for the load average to fall to the core count
and for every other ddnb cluster (engines, torchrun, horovodrun, test worlds) to be gone
(`ddnb.runtime.conditions.busy_reasons`); if the machine stays busy it refuses, naming why, unless
--force is given.
"""
import argparse
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

from ddnb.runtime.conditions import busy_reasons


def wait_until_quiet(seconds: float) -> list[str]:
    """Poll until the machine is quiet or `seconds` have passed; the reasons it is busy."""
    deadline = time.monotonic() + seconds
    while (reasons := busy_reasons()) and time.monotonic() < deadline:
        time.sleep(5)
    return reasons


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--wait", type=float, default=300, help="seconds to wait for a quiet machine")
    ap.add_argument("--force", action="store_true", help="store outputs even on a busy machine")
    args = ap.parse_args(argv)
    for path in args.notebooks:
        reasons = wait_until_quiet(args.wait)
        if reasons and not args.force:
            print(f"{path}: not run; the machine is busy, so its timings would not be representative:\n  "
                  + "\n  ".join(reasons) + "\n(wait for it to be quiet, or pass --force)", file=sys.stderr)
            return 3
        t0 = time.monotonic()
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                                resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
        client.execute()
        nbformat.write(nb, path)
        print(f"{path}: ran in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
