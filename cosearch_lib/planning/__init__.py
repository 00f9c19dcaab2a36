"""Planning a job before the queue (``cosearch plan``): the model shapes of a profile's policies and
encoder, the throughputs measured on GPUs and on this machine's CPU, and the plan that multiplies a
profile's workload by them into memory per rank and node, seconds per step by stage, GPU-hours, and
the refusals that ``cosearch slurm train`` and ``cosearch grid --slurm`` act on. No stage of the
method runs here; it reads only configuration."""
