"""Benchmarks, one module each, run from the command line by `python -m ddnb.bench` or
`ddnb bench` (`ddnb/bench/__main__.py`):

- `ddnb.bench.allreduce`: all-reduce time, algbw and busbw per size and algorithm, and the
  alpha-beta-gamma model's prediction beside it (`notebooks/05_allreduce.ipynb`);
- `ddnb.bench.alltoall`: all-to-all time, algbw and busbw per size, pairwise exchange and
  Bruck against torch's (`notebooks/03_collectives.ipynb`);
- `ddnb.bench.dp`: a data-parallel training step per strategy (naive, bucketed, DDP,
  Horovod) (`notebooks/06_data_parallelism.ipynb`);
- `ddnb.bench.pipeline`: the bubble of every pipeline schedule (GPipe, 1F1B, interleaved,
  ZB-H1, ZB-V, DualPipeV, or one of your own) measured beside its formula, with the peak of
  micro-batches in flight and the step time (`notebooks/09_pipeline_parallelism.ipynb`,
  `notebooks/09b_zero_bubble.ipynb`);
- `ddnb.bench.compress`: bytes per step, step time and final accuracy per gradient
  compression method (`notebooks/14_precision_compression.ipynb`);
- `ddnb.bench.emulated_ring`: the ring all-reduce's time, and its latency and bandwidth
  terms, measured on an emulated cluster (`notebooks/12_scalability.ipynb`; no command);
- `ddnb.bench.links`: the alpha-beta-gamma model's parameters measured on live processes
  (ping-pong, sendrecv, a local add, a pairwise swap) (`notebooks/05_allreduce.ipynb`);
- `ddnb.bench.measure`: those, two all-reduces and a data-parallel step on the first n
  ranks (`notebooks/12_scalability.ipynb`; no command);
- `ddnb.bench.ps` and `ddnb.bench.parameter_server`: the BSP step of k parameter servers
  against the ring all-reduce per worker count, beside its model, and the hierarchical
  server's step grouped by hosts and flat (`notebooks/04_parameter_server.ipynb`,
  `notebooks/05b_decentralized.ipynb`);
- `ddnb.bench.hogwild`: Hogwild!'s processes started on shared memory, conflict rate
  (`notebooks/05b_decentralized.ipynb`; no command);
- `ddnb.bench.horovod_knobs`: Horovod re-formed on a cluster's engines under each fusion
  setting, and a few steps timed (`notebooks/07_horovod.ipynb`; no command);
- `ddnb.bench.plan`: the layout planner's ranking, and its model against Megatron-LM's
  Table 1 (`--paper megatron2021`); formulas only, nothing starts (`notebooks/12_scalability.ipynb`);
- `ddnb.bench.context_parallel`: each context-parallel scheme's attention time on an
  emulated cluster (`notebooks/13_sequence_context_expert.ipynb`; no command).

The algorithm modules keep what runs on each rank; the harnesses here start the processes
(a `ddnb.testing.World`, a cluster's engines) that run it.
"""
