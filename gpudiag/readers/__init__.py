"""Readers: profile files -> Trace. Nothing here runs while a job runs (that is `collectors/`).

`sources.load` (`gpudiag.load`) expands folders and picks each file's reader by content
through `registry` (sniff the first bytes, then `"module:function"`, imported on first use).
One subpackage per format with several modules (`kineto/`, `chrome/`, `nsys/`, `ncu/`,
`torch_memory/`, `xplane/`), one module per small format (`nccl_tests`), `files` (bounded,
regular-file-only reads and the budgets) and `run_dir` (a `gpudiag profile` run directory).
"""
