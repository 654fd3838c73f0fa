"""Prose that matches its outputs (issue #27, part 5): a number that a notebook's markdown
quotes as a *measurement* must be one that nbval checks in that notebook's stored outputs.

The notebooks are stored with their outputs and re-stored by `make notebooks`. What varies
from run to run (the outputs of cells marked `# NBVAL_IGNORE_OUTPUT`, and the durations that
notebooks/sanitize.cfg replaces before nbval compares) changes at every re-store, so prose
that quotes it goes stale. A quoted number therefore fails, naming notebook, cell index and
number, when it is

- **not shown**: in none of the notebook's stored outputs (text/plain, stream text), or
- **run-dependent**: only in outputs that vary between runs. Describe the finding and point
  at the output instead ("the table above prints the step times"), or quote what nbval checks.

What counts as a quoted number (markdown cells only, after removing fenced code, inline
`code`, $LaTeX$, link targets, URLs, HTML tags and the "**Time.**" reading-time line):
a decimal (3.91), a number with thousands commas (4,096), or a number with a unit (40 ms,
587.2 MB, 31%, 1.9×). Not counted: plain integers (no unit, no comma: counts, chapters, years
such as 2019), integers below 10 even with a unit (4 ranks, 2 ms), numbers written with an
exponent (1e-5: tolerances, as in code), version numbers (0.28.1), arXiv ids (1909.08053),
numbers right after Sec./§/Eq./Table/Fig./App. (citations), numbers right after "=" (a
stated input or a value worked out in the sentence: α = 50 µs, 3·32·32 = 3,072), and
numbers that are literals of the notebook's own code cells, as written or in base units
(262_144, lr=0.1, 20 GB/s = 20e9: inputs the reader sees in the code; never a percentage or
a ×, which prose reports and code does not state).

When an output matches: at the precision the number is written with. 3.9 covers
[3.85, 3.95], so an output 3.91 or 3.9049 matches; an integer's trailing zeros are rounding,
keeping two significant digits (1,400 covers [1,350, 1,450]; 260 covers [255, 265]). Units:
a quoted unit matches an output of the same kind converted (0.53 s = 530 ms; KB/MB/GB with
decimal or binary prefixes, MB = MiB), or an output without a unit as printed; a byte size
also matches a unitless byte count (1.5 MB = 1,572,864); a percentage matches an output
percentage or a unitless fraction (31% = 0.31); × and x are one unit. Signs are ignored.

A design question (an exercise headed "... (design)") and the model answers of exercises
(markdown cells tagged `solution`) are not read: they state a hypothetical cluster and work
it out, and quote no measurement.

Every other number that is not a measurement (constants, published figures, hardware specs,
values the reader computes) is in ALLOWED, keyed by notebook and a regex on the number as
written, with its reason; an entry that no longer excuses anything fails too.
"""
import configparser
import io
import json
import math
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# unit as written -> (kind, size in the kind's base unit); byte prefixes are tried both decimal
# and binary (see _sizes)
_UNITS = {
    "ns": ("s", 1e-9), "µs": ("s", 1e-6), "us": ("s", 1e-6), "ms": ("s", 1e-3), "s": ("s", 1.0),
    "sec": ("s", 1.0), "seconds": ("s", 1.0), "min": ("s", 60.0), "minutes": ("s", 60.0),
    "B": ("B", 1.0), "bytes": ("B", 1.0), "kB": ("B", 1e3), "KB": ("B", 1e3), "MB": ("B", 1e6),
    "GB": ("B", 1e9), "TB": ("B", 1e12), "KiB": ("B", 2.0 ** 10), "MiB": ("B", 2.0 ** 20),
    "GiB": ("B", 2.0 ** 30), "TiB": ("B", 2.0 ** 40),
    "MB/s": ("B/s", 1e6), "GB/s": ("B/s", 1e9), "TB/s": ("B/s", 1e12), "Gb/s": ("b/s", 1e9),
    "GFLOP": ("FLOP", 1e9), "TFLOP": ("FLOP", 1e12), "PFLOP": ("FLOP", 1e15),
    "GFLOP/s": ("FLOP/s", 1e9), "TFLOP/s": ("FLOP/s", 1e12), "TFLOPS": ("FLOP/s", 1e12),
    "%": ("%", 1.0), "x": ("×", 1.0), "×": ("×", 1.0),
}
_UNIT = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
# a number (thousands commas, any dotted parts, an exponent), then an optional unit that no
# letter, digit or slash continues
NUMBER = re.compile(r"(?<![\w.,])(?P<num>(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<dot>(?:\.\d+)*)(?P<exp>[eE][+-]?\d+)?)"
                    r"(?:\s?(?P<unit>" + _UNIT + r")(?![\w/]))?")
_CITATION = re.compile(r"(?:\bSecs?\.|\bSections?|§|\bEqs?\.|\bTables?|\bFigs?\.|\bFigure|\bApp\.|\bAppendix"
                       r"|\bAlgorithm|\barXiv|\bExercises?)\s*$")            # Exercise 05.2: an id
# a design question states a hypothetical cluster and its model answer works it out: their
# numbers are inputs and the reader's arithmetic, not measurements, so neither cell is read
DESIGN = re.compile(r"#+\s*Exercise\s+\S+\s+—.*\(design\)")
_ASSIGNED = re.compile(r"[\w′'·×*/+−^()]\s*=\s*~?$")


def _sanitized() -> list[re.Pattern]:
    """What nbval replaces before comparing (notebooks/sanitize.cfg): durations, pids, addresses."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "notebooks" / "sanitize.cfg", encoding="utf-8")
    return [re.compile(cfg[s]["regex"]) for s in cfg.sections()]


VARYING = _sanitized()


def _numbers(text: str):
    """(match, value, unit) of every number in text; x/× before a number is a product (4 × 4)."""
    for m in NUMBER.finditer(text):
        if m.group("dot").count(".") > 1:                          # 0.28.1: a version
            continue
        unit = m.group("unit")
        if unit in ("x", "×") and re.match(r"\s*\d", text[m.end():]):
            unit = None
        yield m, float(m.group("num").replace(",", "")), unit


def _strip_markdown(md: str) -> str:
    """The prose of a markdown cell: code, math, links' targets, URLs, HTML and the reading-time
    line blanked (same length kept, so positions stay meaningful)."""
    blank = lambda m: " " * len(m.group(0))  # noqa: E731
    for pattern, flags in ((r"```.*?```|~~~.*?~~~", re.S), (r"\$\$.*?\$\$", re.S), (r"\$[^$\n]+\$", 0),
                           (r"``.*?``|`[^`\n]*`", 0), (r"\]\([^)]*\)", 0), (r"https?://\S+", 0),
                           (r"<[^>\n]+>", 0), (r"\*\*Time\.?\*\*[^\n]*", 0)):
        md = re.sub(pattern, blank, md, flags=flags)
    return md


def quoted_numbers(md: str) -> list[tuple[str, float, int, str | None, int]]:
    """(as written, value, decimals, unit, position) of every number the prose quotes."""
    text = _strip_markdown(md)
    found = []
    for m, value, unit in _numbers(text):
        dotted, plain = m.group("dot"), not m.group("dot") and "," not in m.group("int")
        if m.group("exp"):
            continue                                               # 1e9: written as in code
        if plain and (unit is None or value < 10):
            continue                                               # plain integers, small counts
        if re.fullmatch(r"\d{4}\.\d{4,5}", m.group("num")) and unit is None:
            continue                                               # an arXiv id
        before = text[:m.start()]
        if _CITATION.search(before) or _ASSIGNED.search(before):
            continue                                               # Sec. 4.1; α = 50 µs
        written = m.group("num") + (f" {unit}" if unit and unit not in ("%", "x", "×") else unit or "")
        found.append((written, value, len(dotted) - 1 if dotted else 0, unit, m.start()))
    return found


def _tolerance(written: str, value: float, decimals: int) -> float:
    """Half a unit in the last place written; an integer's trailing zeros are rounding, two
    significant digits kept."""
    if decimals:
        return 0.5 * 10 ** -decimals
    digits = re.sub(r"\D", "", written.split(".")[0])
    zeros = len(digits) - len(digits.rstrip("0"))
    return 0.5 * 10 ** max(0, min(zeros, len(digits) - 2))


def _sizes(unit: str) -> list[float]:
    kind, size = _UNITS[unit]
    if kind == "B" and size > 1:                                   # KB, MB, ... decimal or binary
        k = round(math.log10(size) / 3)
        return [1000.0 ** k, 1024.0 ** k]
    return [size]


def _candidates(value: float, unit: str | None, quoted_unit: str | None) -> list[float]:
    """The output number `value` (with `unit`) expressed in the quoted number's unit."""
    if quoted_unit is None:
        return [value]
    qkind = _UNITS[quoted_unit][0]
    if unit is None:
        if qkind == "%":
            return [value * 100]                                   # a fraction: 0.31 = 31%
        out = [value]
        if qkind == "B":
            out += [value / s for s in _sizes(quoted_unit)]        # a byte count
        return out
    if _UNITS[unit][0] != qkind:
        return []
    return [value * so / sq for so in _sizes(unit) for sq in _sizes(quoted_unit)]


def output_numbers(text: str) -> list[tuple[float, str | None]]:
    return [(value, unit) for _, value, unit in _numbers(text)]


def matches(quoted: tuple, pool) -> bool:
    written, value, decimals, unit, _ = quoted
    tol = _tolerance(written, value, decimals) * (1 + 1e-9) + 1e-12
    return any(abs(abs(c) - value) <= tol for v, u in pool for c in _candidates(v, u, unit))


def _output_texts(cell):
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            yield "".join(o["text"])
        elif "text/plain" in o.get("data", {}):
            yield "".join(o["data"]["text/plain"])


def _code_literals(source: str) -> set[float]:
    lines = "".join(line if not line.lstrip().startswith(("%", "!")) else "\n"
                    for line in source.splitlines(keepends=True))
    try:
        toks = [t.string for t in tokenize.generate_tokens(io.StringIO(lines).readline) if t.type == tokenize.NUMBER]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        toks = re.findall(r"\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?", re.sub(r"#.*", "", lines))
    out = set()
    for t in toks:
        try:
            out.add(float(t.replace("_", "")))
        except ValueError:
            pass
    return out


def _literal(quoted, literals: set[float]) -> bool:
    """The quoted number is a literal of the code, as written or in base units (20 GB/s = 20e9);
    never a percentage or a ratio (×), which code does not state as inputs but prose reports."""
    _, value, _, unit, _ = quoted
    if unit in ("%", "x", "×"):
        return False
    values = [value] + ([value * s for s in _sizes(unit)] if unit else [])
    return any(math.isclose(v, lit, rel_tol=1e-9) for v in values for lit in literals)


def notebook_numbers(path: pathlib.Path):
    """(stable outputs, run-dependent outputs, code literals, markdown cells by index)."""
    nb = json.loads(path.read_text())
    stable, varying, literals, markdown = [], [], set(), {}
    for i, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if not (DESIGN.match(source) or "solution" in cell["metadata"].get("tags", [])):
                markdown[i] = source
            continue
        if cell["cell_type"] != "code":
            continue
        literals |= _code_literals(source)
        ignored = "NBVAL_IGNORE_OUTPUT" in source
        for text in _output_texts(cell):
            if ignored:
                varying += output_numbers(text)
            else:
                for pattern in VARYING:
                    varying += output_numbers(" ".join(m.group(0) for m in pattern.finditer(text)))
                    text = pattern.sub(" ", text)
                stable += output_numbers(text)
    return stable, varying, literals, markdown


def chapter(path: pathlib.Path) -> str:
    return path.name.split("_")[0]


# Numbers the prose quotes that are not measurements of this notebook: (chapter, regex on the
# number as written, reason). Keep it short and say why.
ALLOWED: list[tuple[str, str, str]] = [
    ("01", r"46%|43%", "published MFU: PaLM (Chowdhery et al. 2022, Table 3), Llama 3 405B (Dubey et al. 2024, "
                      "Table 4); citations"),
    ("01", r"65,536", "2^16, the largest vocabulary whose token ids fit in 2 bytes: a constant"),
    ("01b", r"100x", "a GPU against this CPU, an order of magnitude stated as such, not measured here"),
    ("03", r"16 MB", "4,194,304 float32 values, the checker's largest tensor: an input stated in the exercise"),
    ("04", r"40 bytes", "a message's header, (5,) float64: a constant of ddnb.parameter_server.messages"),
    ("04", r"0\.53 MB", "the MLP 64-1024-64-10's parameters, (64·1024 + 1024 + 1024·64 + 64 + 64·10 + 10)·4 = "
                        "531,240 bytes: fixed by the shape the sentence states"),
    ("05", r"0\.033 s", "0.1 s / 3, the benchmark's timing window: an input"),
    ("05", r"62\.5 KB", "α·B of the 10gbe profile, 50 µs × 1.25 GB/s: a constant of the profile"),
    ("05b", r"1\.5", "2(N − 1)/N for N = 4, the ring all-reduce's factor: a formula's value"),
    ("05b", r"77 KB", "the MLP 64-256-10's parameters, (64·256 + 256 + 256·10 + 10)·4 = 76,840 bytes: fixed by the "
                     "shape the sentence states"),
    ("05b", r"0\.11 ms", "α + S/B of one message on the 10gbe link, 50 µs + 76,840 B / 1.25 GB/s: the model's"),
    ("06", r"5\.7 KB", "bucket 0, (128·10 + 10 + 128)·4 = 5,672 bytes: fixed by the MLP's shape"),
    ("06", r"1\.5 MB", "40·(128·128 + 128)·4 bytes = 2.52 MiB of gradients less DDP's 1 MiB first bucket: fixed by "
                       "the model and DDP's defaults"),
    ("06", r"25 GB/s|300 GB/s", "the ib profile's InfiniBand and NVLink bandwidths: hardware specs"),
    ("07", r"0\.21", "a Horovod version"),
    ("07", r"128 MB", "Horovod's default fusion threshold: a constant of Horovod"),
    ("07", r"260 KB", "the 34 gradients of the 16 × 64 MLP, (16·(64·64 + 64) + 64·10 + 10)·4 = 268,840 bytes: fixed "
                      "by the shape the text states"),
    ("07", r"0\.2 ms", "a cycle time the code sets (--cycle-time-ms 0.2, a string there): an input"),
    ("12", r"12\.5|15\.7|25\.6|3\.8|40%",
     "section 2's illustrative round numbers, stated as not measurements: link and device specs, ResNet-50's "
     "published size and FLOPs, an assumed 40% MFU"),
    ("12", r"3,456", "Mikami et al. 2018 trained on 3,456 GPUs: a citation"),
    ("16", r"6\.7 B", "the stated model, GPT-3 6.7B's shape (Brown et al. 2020, Table 2.1): 32 blocks of 12·4096² plus "
                      "51,200·4096 embeddings, about 6.6e9 parameters: an input"),
    ("16", r"312 TFLOP/s|200 Gb/s", "the A100's bf16 peak and an HDR InfiniBand link, the paper's hardware: specs"),
]


def _allowed(ch: str, written: str):
    return next((e for e in ALLOWED if e[0] == ch and re.fullmatch(e[1], written)), None)


def findings(path: pathlib.Path):
    """[(cell index, number as written, 'not shown' | 'run-dependent', allow-list entry or None)]."""
    stable, varying, literals, markdown = notebook_numbers(path)
    out = []
    for i, md in markdown.items():
        for q in quoted_numbers(md):
            if _literal(q, literals) or matches(q, stable):
                continue
            kind = "run-dependent" if matches(q, varying) else "not shown"
            out.append((i, q[0], kind, _allowed(chapter(path), q[0])))
    return out


def test_the_rules_catch_what_they_are_for():
    nums = lambda md: [q[0] for q in quoted_numbers(md)]  # noqa: E731
    assert nums("BSP took 3.91 s (91.8%), 2 workers, 4,096 ranks, Sec. 4.1, `3.5 ms`, $0.5$, in 2019") == [
        "3.91 s", "91.8%", "4,096"]
    assert nums("Horovod 0.28.1, arXiv 1909.08053, α = 50 µs, 4 × 4, 1.9× one worker, 40 ms") == ["1.9×", "40 ms"]
    assert nums("3·32·32 = 3,072 bytes, within 1e-5, **Time.** about 35 minutes") == []
    q = lambda md: quoted_numbers(md)[0]  # noqa: E731
    assert matches(q("3.9 s"), output_numbers("3.91 s")) and matches(q("3.9"), output_numbers("3.9049"))
    assert not matches(q("3.9 s"), output_numbers("3.96 s"))
    assert matches(q("31%"), output_numbers("0.31")) and matches(q("31%"), output_numbers("31.2%"))
    assert not matches(q("31%"), output_numbers("31 min"))
    assert matches(q("1.5 MB"), output_numbers("1,572,864 bytes")) and matches(q("1.5 MB"), output_numbers("1572864"))
    assert matches(q("530 ms"), output_numbers("0.53 s")) and not matches(q("530 ms"), output_numbers("0.53 GB"))
    assert matches(q("1,400 samples/s"), output_numbers("1398 samples/s"))
    assert not matches(q("1,400 samples/s"), output_numbers("1863 samples/s"))


def test_stored_outputs_are_stable_or_varying_as_nbval_sees_them(tmp_path):
    nb = {"cells": [
        {"cell_type": "code", "source": "# NBVAL_IGNORE_OUTPUT\nprint(t)", "metadata": {},
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "step 3.91 s\n"}]},
        {"cell_type": "code", "source": "print(b)", "metadata": {},
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "587.2 MB in 1.20 ms\n"}]},
        {"cell_type": "markdown", "source": "BSP took 3.91 s; 587.2 MB per rank in 1.20 ms; 469.8 MB for TP.",
         "metadata": {}}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps(nb))
    assert [(i, n, kind) for i, n, kind, _ in findings(path)] == [
        (2, "3.91 s", "run-dependent"), (2, "1.20 ms", "run-dependent"), (2, "469.8 MB", "not shown")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_quotes_only_numbers_its_outputs_show(path):
    bad = [f"{path.name} cell {i}: {n!r} is {kind}" for i, n, kind, entry in findings(path) if entry is None]
    assert not bad, ("markdown quotes numbers that the stored outputs nbval checks do not show "
                     "(describe the finding and point at the output, or add to ALLOWED with a reason):\n"
                     + "\n".join(bad))


def test_every_allowed_entry_still_excuses_something():
    used = {id(e) for p in NOTEBOOKS for *_, e in findings(p) if e is not None}
    stale = [e[:2] for e in ALLOWED if id(e) not in used]
    assert not stale, f"ALLOWED entries that no longer match a quoted number: {stale}"
