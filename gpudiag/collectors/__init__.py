"""Collectors: what records while the job runs, inside its processes or beside it.

In-process plugins started by the bootstrap (`profiler/inproc.py`) when the program imports
their framework: `torch_plugin` (torch.profiler segments), `torch_snapshot` (the CUDA
allocator at exit), `jax_plugin`, `cupti/` (CUPTI activity), `nccl/` (collectives timed with
CUDA events or the host clock). In the session process: `nvml/` (the sampler), `external`
(nsys / ncu around the command, with `ncu_wrappers/`). `probes`: what this machine can
collect, and the one NVML choke point. Collectors write files that `readers/` turn into a
Trace; they import only ground modules and readers.
"""
