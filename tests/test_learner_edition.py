"""The learner's edition (`make lab`, `ddnb.exercises.edition`): every chapter's answers
start blank, copies are never overwritten, a checker given a stub answers one line, and a
learner's copy runs top to bottom without an error (three chapters here, every chapter in
`make test-learner`)."""
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ddnb.exercises import attempted, check_allreduce, check_prediction, solution
from ddnb.exercises.edition import NOTEBOOKS, answer_cells, build, chapter_of, exercise_id, learner_copy, problems, source

PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_every_exercise_is_numbered_in_order_and_has_an_answer_cell_with_a_stub(path):
    nb = json.loads(path.read_text())
    assert problems(nb, chapter_of(path)) == []
    assert len(answer_cells(nb)) >= 3


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_the_learners_copy_shows_no_answer_and_no_output(path):
    nb = json.loads(path.read_text())
    copy = learner_copy(nb)
    texts = [source(c) for c in copy["cells"]]
    for i, cell in answer_cells(nb):
        assert source(copy["cells"][i]) == cell["metadata"]["ddnb"]["stub"]
        answer = [ln.strip() for ln in source(cell).splitlines()
                  if ln.strip() and ln.strip() not in cell["metadata"]["ddnb"]["stub"]]
        assert answer, f"cell {i}: the solution adds nothing to its stub"
        longest = max(answer, key=len)                       # the answer's most telling line
        assert not any(longest in t for t in texts), f"cell {i}: the answer line {longest!r} is in the copy"
    assert not any(c.get("outputs") for c in copy["cells"] if c["cell_type"] == "code")
    assert source(nb["cells"][answer_cells(nb)[0][0]]) != source(copy["cells"][answer_cells(nb)[0][0]])


def test_a_copy_is_never_overwritten_and_reset_keeps_the_old_one(tmp_path):
    first = build(dst=tmp_path, chapters=["00"])
    assert len(first) == 1 and "copied" in first[0]
    mine = tmp_path / "00_getting_started.ipynb"
    work = json.loads(mine.read_text())
    i = answer_cells(work)[0][0]
    work["cells"][i]["source"] = "my_allreduce_value = 10.0   # the learner's answer"
    mine.write_text(json.dumps(work))
    assert "kept" in build(dst=tmp_path, chapters=["00"])[0]
    assert "the learner's answer" in mine.read_text()
    again = build(dst=tmp_path, reset=["00"], chapters=["00"])
    assert "copied again" in again[0]
    assert "the learner's answer" not in mine.read_text()
    kept = list((tmp_path / ".reset").glob("00_getting_started.*.ipynb"))
    assert len(kept) == 1 and "the learner's answer" in kept[0].read_text()


def test_an_unknown_chapter_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"chapters \['99'\].*'05b'"):
        build(dst=tmp_path, reset=["99"])


def test_a_heading_out_of_order_or_an_answer_without_a_stub_is_named():
    nb = json.loads((NOTEBOOKS / "05_allreduce.ipynb").read_text())
    i, cell = answer_cells(nb)[0]
    del cell["metadata"]["ddnb"]["stub"]
    nb["cells"][i - 1]["source"] = source(nb["cells"][i - 1]).replace("Exercise 05.1", "Exercise 05.9")
    said = "\n".join(problems(nb, "05"))
    assert "['05.9', '05.2'," in said and "should be ['05.1', '05.2'," in said and "no ddnb.stub" in said


def test_solution_prints_the_solved_editions_answer(capsys):
    text = solution("05.2")
    assert "def my_ring_allreduce" in text and "isend" in text
    assert "Exercise 05.2, a model answer" in capsys.readouterr().out
    with pytest.raises(ValueError, match="has the exercises"):
        solution("05.9")


def test_a_checker_given_a_stub_says_not_attempted_and_returns(capsys):
    def my_ring_allreduce(tensor):
        raise NotImplementedError("Exercise 05.2: write my_ring_allreduce")

    assert not attempted(my_ring_allreduce) and not attempted(...) and attempted(3.0) and attempted(len)
    line = check_allreduce(my_ring_allreduce, world_size=3)
    assert line.startswith("Exercise 05.2 not attempted yet") and "my_ring_allreduce" in line
    line = check_prediction(..., 10.0, what="the sum", exercise="00.1")
    assert line.startswith("Exercise 00.1 not attempted yet")
    assert capsys.readouterr().out.count("not attempted yet") == 2


def test_a_stub_that_raises_only_on_the_ranks_is_not_attempted_either():
    def half_written(tensor):
        if tensor.numel() > 0:
            raise NotImplementedError("Exercise 05.2: the all-gather half")

    assert check_allreduce(half_written, world_size=3).startswith("Exercise 05.2 not attempted yet")


def test_a_real_not_implemented_error_is_a_failure_not_a_stub():
    def uses_a_missing_op(tensor):
        raise NotImplementedError("aten::something is not implemented for 'Half'")

    with pytest.raises(AssertionError, match="NotImplementedError"):
        check_allreduce(uses_a_missing_op, world_size=3)


# Two chapters with many stubbed exercises (03: five, 10: design questions too); chapter 00's
# solved edition runs in a real browser (test_browser.py), and `make test-learner` runs every
# learner's copy (00's took 38 s of this suite's 30-minute budget).
@pytest.mark.parametrize("chapter", ["03", "10"])
def test_a_learners_copy_runs_top_to_bottom_without_an_error(chapter, tmp_path):
    build(dst=tmp_path, chapters=[chapter])
    (path,) = tmp_path.glob(f"{chapter}_*.ipynb")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    said = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    code_answers = [c for _, c in answer_cells(json.loads(path.read_text())) if c["cell_type"] == "code"]
    assert said.count("not attempted yet") >= len(code_answers)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_every_exercise_is_checked_after_its_answer_cell(path):
    """A prediction may come well before the cell that measures it; its check comes after both."""
    nb = json.loads(path.read_text())
    answered = {exercise_id(c): i for i, c in answer_cells(nb)}
    checked = {}
    for i, cell in enumerate(nb["cells"]):
        for ex in re.findall(r'exercise="([^"]+)"', source(cell)) if cell["cell_type"] == "code" else []:
            assert ex in answered and i > answered[ex], f"cell {i} checks exercise {ex} before its answer cell"
            checked.setdefault(ex, i)
    coded = sorted(ex for ex, i in answered.items() if nb["cells"][i]["cell_type"] == "code")
    assert sorted(checked) == coded, "an exercise no checker call names (a design question's answer is prose)"
