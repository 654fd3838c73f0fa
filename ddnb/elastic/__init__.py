"""Elastic training: the world size changes during a run and training goes on.

In a notebook (a Cluster resized between steps):

    sampler.py     ElasticSampler, exactly_once    the epoch's position (epoch, consumed): after a
                                                   resize the new ranks read exactly the unseen samples
    checkpoint.py  save, load, ModelState, ZeroState
                                                   torch.distributed.checkpoint (DCP): saved by N ranks,
                                                   loaded by M (replicated, ddnb ZeRO-3, torch FSDP2)
    resize.py      resize, ElasticState            checkpoint, restart the cluster with n workers,
                                                   reload resharded, continue the epoch
    train.py       digits_state, train_steps       the digits MLP trained data-parallel, resizable

Under a launcher (workers restarted on every membership change):

    torchrun_train.py  under torchrun --nnodes MIN:MAX (c10d rendezvous): resume from rank 0's
                       checkpoint at the global count of consumed examples (`python -m ddnb.launch elastic`)
    torchrun_demo.py   kill_and_add: a node SIGKILLed and a node added, for real, on one machine
    horovod_train.py   hvd.elastic.run + TorchState (commit / restore / sync) under horovodrun
                       with a host discovery script

Taught in `notebooks/15_elastic_training.ipynb`.
"""
