"""Two ranks under torchrun; rank 1 deadlocks (a lock taken twice) after a little torch work.

    torchrun --standalone --nproc-per-node 2 tests/programs/rank_hangs.py

Without the session's watchdog `gpudiag profile` would wait for it forever.
"""

import os
import threading

import torch

x = torch.ones(4)
for _ in range(3):
    (x * 2).sum().item()
if os.environ.get("RANK") == "1":
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never returns: no CPU used, no progress
