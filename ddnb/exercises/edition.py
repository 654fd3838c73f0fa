"""Two editions of every notebook from one source: the stored notebooks under `notebooks/`
are the solved edition (run, stored with outputs, checked by nbval); the learner's edition
under `learn/` is built from them with every answer blank.

An answer cell is a cell tagged `solution` whose metadata names its exercise and carries
the stub a learner starts from (nbgrader's idea, Hamrick 2016, with the stub kept in the
same cell instead of generated):

    {"tags": ["solution"], "ddnb": {"exercise": "05.1",
     "stub": "def my_ring_allreduce(tensor):\\n    raise NotImplementedError(\\"Exercise 05.1: ...\\")"}}

The learner's copy replaces each such cell's source with its stub and clears every code
cell's outputs. Exercise ids are `chapter.number` ("05.1"), numbered in order of appearance
in each chapter, and every exercise heading says its id ("### Exercise 05.1 — ...").
A copy is made once: `build` never overwrites a learner's work, except for the chapters
named in `reset` (the old copy is kept under `learn/.reset/`).

    python -m ddnb.exercises                 # make learn: copy what is missing
    python -m ddnb.exercises --reset 05      # make lab RESET=05: copy chapter 05 again
    solution("05.1")                                 # print the answer, on request

Used by `make learn` / `make lab` and `make test-learner`; every notebook, from
notebooks/00_getting_started.ipynb on, carries its answers this way.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import time
from pathlib import Path

TAG = "solution"
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
HEADING = re.compile(r"^#+\s*Exercise\s+(\d+[a-z]?\.\d+)\b", re.M)
ID = re.compile(r"^(\d+[a-z]?)\.(\d+)$")


def chapter_of(path: str | Path) -> str:
    """'05' for notebooks/05_allreduce.ipynb, '05b' for 05b_decentralized.ipynb."""
    return Path(path).name.split("_", 1)[0]


def answer_cells(nb: dict) -> list[tuple[int, dict]]:
    """(cell index, cell) of every answer cell of a notebook, in order."""
    return [(i, c) for i, c in enumerate(nb["cells"]) if TAG in c.get("metadata", {}).get("tags", [])]


def exercise_id(cell: dict) -> str:
    return cell.get("metadata", {}).get("ddnb", {}).get("exercise", "")


def source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def problems(nb: dict, chapter: str) -> list[str]:
    """What is wrong with a solved notebook's exercises (empty when it can be built): every
    answer cell has an id of this chapter and a stub; ids follow the headings, in order."""
    out = []
    headings = [(i, m.group(1)) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"
                for m in HEADING.finditer(source(c))]
    want = [f"{chapter}.{k}" for k in range(1, len(headings) + 1)]
    if [h for _, h in headings] != want:
        out.append(f"exercise headings {[h for _, h in headings]} should be {want} (numbered in order of appearance)")
    for i, cell in answer_cells(nb):
        meta = cell["metadata"].get("ddnb", {})
        ex, stub = meta.get("exercise"), meta.get("stub")
        if not ex or not ID.match(ex) or ID.match(ex).group(1) != chapter:
            out.append(f"cell {i}: tagged {TAG!r} but its metadata ddnb.exercise={ex!r} is not an id of chapter {chapter}")
            continue
        if not isinstance(stub, str) or not stub.strip():
            out.append(f"cell {i} (exercise {ex}): no ddnb.stub to start the learner from")
        elif stub.strip() == source(cell).strip():
            out.append(f"cell {i} (exercise {ex}): the stub is the solution")
        before = [h for j, h in headings if j < i]
        if not before or before[-1] != ex:
            out.append(f"cell {i}: answers exercise {ex} but follows the heading of {before[-1] if before else 'none'}")
    answered = {exercise_id(c) for _, c in answer_cells(nb)}
    out += [f"exercise {h} (cell {j}) has no answer cell tagged {TAG!r}" for j, h in headings if h not in answered]
    return out


def learner_copy(nb: dict) -> dict:
    """The learner's edition of a solved notebook: stubs for answers, no outputs."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        meta = cell.get("metadata", {})
        if TAG in meta.get("tags", []):
            cell["source"] = meta["ddnb"]["stub"]
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            meta.pop("execution", None)
    return nb


def _notebooks(src: Path) -> list[Path]:
    return sorted(p for p in Path(src).glob("*.ipynb") if not p.name.startswith("."))


def build(src: str | Path = NOTEBOOKS, dst: str | Path = ROOT / "learn", reset=(), chapters=None) -> list[str]:
    """Copy every solved notebook of `src` (or those of `chapters`) into `dst` as the
    learner's edition, unless a copy is there already (a learner's work is never
    overwritten); a chapter in `reset` is copied again, its old copy moved to
    dst/.reset/. Returns one line per notebook: what happened to it."""
    src, dst = Path(src), Path(dst)
    paths = _notebooks(src)
    known = {chapter_of(p) for p in paths}
    unknown = [c for c in list(reset) + list(chapters or []) if c not in known]
    if unknown:
        raise ValueError(f"chapters {unknown}: not in {src} (have {sorted(known)}); name one as '05' or '05b'")
    dst.mkdir(parents=True, exist_ok=True)
    lines = []
    for path in paths:
        ch = chapter_of(path)
        if chapters is not None and ch not in chapters:
            continue
        nb = json.loads(path.read_text())
        bad = problems(nb, ch)
        if bad:
            raise ValueError(f"{path.name}: " + "; ".join(bad))
        target = dst / path.name
        if target.exists() and ch not in reset:
            lines.append(f"{target}: kept (your work; make lab RESET={ch} copies it again)")
            continue
        if target.exists():
            keep = dst / ".reset" / f"{path.stem}.{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
            keep.parent.mkdir(exist_ok=True)
            shutil.move(target, keep)
            lines.append(f"{target}: copied again (your old copy is {keep})")
        else:
            lines.append(f"{target}: copied, {len(answer_cells(nb))} answer(s) blank")
        target.write_text(json.dumps(learner_copy(nb), indent=1, ensure_ascii=False) + "\n")
    return lines


def find(exercise: str, src: str | Path = NOTEBOOKS) -> list[dict]:
    """The answer cells of an exercise id ('05.1'), from the solved edition."""
    m = ID.match(str(exercise))
    if not m:
        raise ValueError(f"exercise={exercise!r}: write its id as chapter.number, e.g. '05.1'")
    paths = [p for p in _notebooks(src) if chapter_of(p) == m.group(1)]
    if not paths:
        raise ValueError(f"exercise {exercise}: no chapter {m.group(1)} in {src} (the solved notebooks)")
    cells = [c for _, c in answer_cells(json.loads(paths[0].read_text())) if exercise_id(c) == exercise]
    if not cells:
        ids = sorted({exercise_id(c) for _, c in answer_cells(json.loads(paths[0].read_text()))})
        raise ValueError(f"exercise {exercise}: {paths[0].name} has the exercises {ids}")
    return cells


def solution(exercise: str) -> str:
    """Print (and return) the answer of an exercise: the solved edition's answer cells."""
    text = "\n\n".join(source(c) for c in find(exercise))
    print(f"Exercise {exercise}, a model answer:\n\n{text}")
    return _Shown(text)


class _Shown(str):
    """The printed answer, returned as a str that a notebook does not echo twice."""

    def _ipython_display_(self) -> None:
        pass


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m ddnb.exercises", description=__doc__.split("\n\n")[0])
    p.add_argument("--src", default=str(NOTEBOOKS), help="the solved notebooks (default: %(default)s)")
    p.add_argument("--into", default=str(ROOT / "learn"), help="the learner's copies (default: %(default)s)")
    p.add_argument("--reset", default="", help="chapters to copy again, e.g. 05 or 05,09 (old copies kept)")
    p.add_argument("--chapters", default="", help="only these chapters, e.g. 00,03 (default: all)")
    a = p.parse_args(argv)
    split = lambda s: [c.strip() for c in s.split(",") if c.strip()]   # noqa: E731
    try:
        lines = build(a.src, a.into, reset=split(a.reset), chapters=split(a.chapters) or None)
    except ValueError as e:
        p.error(str(e))                 # one line and exit status 2, before anything is copied
    print("\n".join(lines))


