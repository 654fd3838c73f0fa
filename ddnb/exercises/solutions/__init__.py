"""Solutions of the exercises, one module per chapter's checkers, written as a learner would
write them in the notebook's cells (short, no validation). The stored notebooks run with
these filled in, so nbval checks every checker against a correct answer; tests/test_exercises*.py
check that every checker rejects a typical wrong answer with its hint. The notebooks, from
`notebooks/05_allreduce.ipynb` on, show the same code in the exercise cells.
"""
