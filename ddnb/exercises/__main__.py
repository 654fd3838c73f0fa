"""`python -m ddnb.exercises [--into learn] [--reset 05]`: build the learner's edition
(`ddnb.exercises.edition`); what `make learn` and `make lab` run."""
from ddnb.exercises.edition import main

main()
