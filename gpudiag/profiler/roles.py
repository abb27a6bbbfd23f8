"""What a profiled process is for, when it is not a training or serving process: its role
goes into the process's meta, and the analyses leave helpers out of the training loop's
numbers (a DataLoader worker's whole life read as "Python between ops, 99.8%" and came
first, ahead of the trainer waiting 59% of its step on that very loader).

    role()   # 'dataloader worker' inside torch's DataLoader worker loop, else None

The roles that make a process a helper are `trace_meta.HELPER_ROLES` (what readers see).
"""

from __future__ import annotations

import sys


def role() -> str | None:
    """This process's role, from what the program runs in it (stdlib only, never imports)."""
    worker = sys.modules.get("torch.utils.data._utils.worker")
    if worker is not None and getattr(worker, "_worker_info", None) is not None:
        return "dataloader worker"
    return None
