"""Run notebooks top to bottom and store their outputs in place (what nbval compares).

    python scripts/run_notebooks.py notebooks/00_getting_started.ipynb [...]

Each runs in its own folder with the python3 kernel of this environment; a cell that
raises stops it with the error, and the notebook is not rewritten.
"""
import argparse
import os
import sys
import time

import nbformat
from nbclient import NotebookClient


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = ap.parse_args(argv)
    for path in args.notebooks:
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
