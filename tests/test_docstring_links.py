"""Docstring links that resolve: every notebook a module of ddnb names exists, every dotted
`ddnb.x.y` a docstring names imports (a module, then attributes of it), and every module
names the notebook that teaches it (d2l's rule: each exported piece links back to the
section that explains it)."""
import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = sorted((ROOT / "ddnb").rglob("*.py"))
NOTEBOOK = re.compile(r"notebooks/\d\d[a-z]?_[A-Za-z0-9_]+\.ipynb")
DOTTED = re.compile(r"(?<![\w/.])ddnb(?:\.[A-Za-z_]\w*)+")


def docstrings(path: pathlib.Path) -> list[str]:
    """The module's docstring and those of its classes and functions, at any depth."""
    tree = ast.parse(path.read_text())
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return [d for d in (ast.get_docstring(n) for n in nodes) if d]


def resolves(name: str) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_checks_catch_what_they_are_for():
    assert resolves("ddnb.collectives.ring.ring_allreduce") and resolves("ddnb.cost")
    assert not resolves("ddnb.viz.ring") and not resolves("ddnb.runtime.horovod.horovod_env")
    assert NOTEBOOK.findall("see `notebooks/06_data_parallel.ipynb`") == ["notebooks/06_data_parallel.ipynb"]
    assert DOTTED.findall("`ddnb.cost.alpha_beta`, python -m ddnb.bench allreduce, ddnb/viz/x.py") == [
        "ddnb.cost.alpha_beta", "ddnb.bench"]


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_named_notebooks_exist(path):
    missing = sorted({nb for nb in NOTEBOOK.findall(path.read_text()) if not (ROOT / nb).exists()})
    assert not missing, f"{rel(path)} names notebooks that do not exist: {missing}"


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_dotted_names_in_docstrings_import(path):
    names = {n for d in docstrings(path) for n in DOTTED.findall(d)}
    broken = sorted(n for n in names if not resolves(n))
    assert not broken, f"{rel(path)}: docstrings name {broken}, which do not import"


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_every_module_names_the_notebook_that_teaches_it(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert NOTEBOOK.search(doc), f"{rel(path)}: its module docstring names no notebooks/NN_*.ipynb"
