"""A dry run of a training recipe at its real width on the CPU: no weights, no GPU.

The model is built from its config with fake tensors (``torch._subclasses.fake_tensor``), sharded by the
project's own ``paravt.models.parallel.wrap_fsdp2`` over the N ranks of torch's fake process group, and one
step runs through the trainers' own code. What it measures, per rank: peak memory split into parameters,
gradients, optimizer state, activations and temporaries, and the module running at the peak; the step's
FLOPs, kernel traffic, collectives (bytes all-gathered, reduce-scattered, all-reduced, broadcast), host
syncs, attention calls per block; a roofline bound on a named GPU. ``python -m paravt.dryrun --help``.

* :mod:`paravt.dryrun.fake`: the fake world (process group, fake/real/shadowed tensors, host syncs).
* :mod:`paravt.dryrun.measure`: FLOPs, traffic, collectives (a dispatch mode) and memory (FSDPMemTracker).
* :mod:`paravt.dryrun.workload`: the model and one step's inputs at the recipe's sizes.
* :mod:`paravt.dryrun.steps`: the SFT and RL steps through the trainers' code, one rank at one depth.
* :mod:`paravt.dryrun.report`: GPUs, extrapolation in depth, roofline, the printed table.
* :mod:`paravt.dryrun.recipe`: a recipe's ranks, traces and figures; :mod:`paravt.dryrun.cli`: the command line;
  :mod:`paravt.dryrun.calibrate`: against the GPU check.
"""
