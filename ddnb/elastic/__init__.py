"""Elastic training: the world size changes during a run and training goes on.

    sampler.py     ElasticSampler, exactly_once    the epoch's position (epoch, consumed): after a
                                                   resize the new ranks read exactly the unseen samples
    checkpoint.py  save, load, ModelState, ZeroState
                                                   torch.distributed.checkpoint (DCP): saved by N ranks,
                                                   loaded by M (replicated, ddnb ZeRO-3, torch FSDP2)
    resize.py      resize, ElasticState            checkpoint, restart the cluster with n workers,
                                                   reload resharded, continue the epoch
    train.py       digits_state, train_steps       the digits MLP trained data-parallel, resizable

Taught in `notebooks/14_precision_compression_elastic.ipynb`.
"""
