"""`python -m ddnb.exercises [--into learn] [--reset 05]`: build the learner's edition
(`ddnb.exercises.edition`); what `make learn` and `make lab` run
(the copies of notebooks/00_getting_started.ipynb and the rest go to `learn/`)."""
from ddnb.exercises.edition import main

main()
