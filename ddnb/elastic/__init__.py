"""Elastic training: the world changes size while training goes on.

    torchrun_train.py  under torchrun --nnodes MIN:MAX (c10d rendezvous): workers are restarted
                       on every membership change and resume from rank 0's checkpoint at the
                       global count of consumed examples (`python -m ddnb.launch elastic`)
    torchrun_demo.py   kill_and_add: a node SIGKILLed and a node added, for real, on one machine
    horovod_train.py   hvd.elastic.run + TorchState (commit / restore / sync) under horovodrun
                       with a host discovery script

Taught in `notebooks/14_precision_compression_elastic.ipynb`.
"""
