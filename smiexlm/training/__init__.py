"""What pre-training and fine-tuning share, and the batch jobs that run on several processes:
``optim`` (AdamW's decay groups, the learning-rate schedule), ``run_state`` (a run's state on
disk: weights, optimiser, schedule, RNGs, written atomically and read back), ``runlock`` (one
process at a time in a run's folder), and process placement: ``ranks`` (this process's place
in a job, read from torchrun's variables), ``distributed`` (the process group, sharded
micro-batches, and :func:`~smiexlm.training.distributed.launch_local`, which starts a job on
the free cores of one machine) and ``workers`` (the processes of a batch job such as
``embed`` or ``predict``)."""
