"""What a job's worker imports before its first batch (a local pool's fork server, or each
spawned worker, imports this module: `LocalPool.start`).

`rank_map` alone leaves most of a batch's modules to be imported on first use: the readers
(the Kineto reader and its JSON decoder), the analyzers, which `Analyzer.contract` loads
when a trace needs them, the summary every batch sends and the reduce's combines that run
on workers (`reduce.ELSEWHERE`). Imported here, before the workers are forked, they cost
nothing per worker (a batch of 16 DLRM ranks: 1.11 s with its imports, 0.97 s without).
"""

from __future__ import annotations

import importlib

from gpudiag.analyzers import summary as _summary  # noqa: F401  (every batch's summary part)
from gpudiag.analyzers.pipeline import reduce as _reduce  # noqa: F401  (combines on workers)
from gpudiag.analyzers.pipeline import registry
from gpudiag.jobs import rank_map as _rank_map  # noqa: F401  (the map)
from gpudiag.readers.kineto import joined as _joined  # noqa: F401  (the usual rank file)

for _analyzer in registry.ANALYZERS:
    importlib.import_module(_analyzer.module)
