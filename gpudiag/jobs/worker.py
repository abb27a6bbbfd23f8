"""What a job's worker imports before its first batch (a local pool's fork server, or each
spawned worker, imports this module: `LocalPool.start`).

`rank_map` alone leaves most of a batch's modules to be imported on first use: the readers
(the Kineto reader and its JSON decoder) and the analyzers, which `diagnosis.module_of`
loads when a trace needs them. Imported here, before the workers are forked, they cost
nothing per worker and the first batch runs as fast as the next ones (a batch of 16 DLRM
ranks: 1.11 s cold, 0.97 s warm).
"""

from __future__ import annotations

import importlib

from gpudiag.analyzers import diagnosis
from gpudiag.jobs import rank_map  # noqa: F401  (what the workers run)
from gpudiag.readers.kineto import joined  # noqa: F401  (the usual rank file: Kineto JSON)
from gpudiag.analyzers import summary  # noqa: F401  (every batch sends its summary part)

for _analyzer in diagnosis.ANALYZERS:
    importlib.import_module(_analyzer.module)
