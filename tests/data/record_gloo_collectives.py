"""Record tests/data/gloo_rank{0,1}.pt.trace.json.gz: a 2-rank gloo job on CPU, profiled.

    python tests/data/record_gloo_collectives.py [OUT_DIR]     # OUT_DIR: tests/data

Two processes (torch.multiprocessing.spawn, rendezvous on 127.0.0.1) train a tiny DDP model
for STEPS steps, then make one all_reduce, broadcast, all_gather and barrier each. Only that
part is profiled (activities=[CPU], record_shapes=True, with_stack=False): DDP's
construction-time broadcast and its bucket rebuild after the first backward happen in the
WARMUP steps before, so each rank's trace holds exactly CALLS: STEPS all_reduces of DDP's
one gradient bucket (577 float parameters), then the four calls. Rank 1 sleeps SLEEP_S
before the explicit all_reduce, so that call has a known late rank.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile

WORLD = 2
WARMUP, STEPS = 2, 4
SLEEP_S = 0.02
#: collectives the profiled part makes on each rank, by op (what the tests expect to read)
CALLS = {"all_reduce": STEPS + 1, "broadcast": 1, "all_gather": 1, "barrier": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    for _ in range(WARMUP):
        _step(model, opt, x)
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 with_stack=False) as prof:
        for _ in range(STEPS):
            _step(model, opt, x)
        if rank == 1:
            time.sleep(SLEEP_S)  # the late rank of the next all_reduce
        dist.all_reduce(torch.ones(1000))                    # 4000 bytes, float
        dist.broadcast(torch.arange(64, dtype=torch.int64), src=0)   # 512 bytes
        parts = [torch.empty(10, dtype=torch.float64) for _ in range(WORLD)]
        dist.all_gather(parts, torch.full((10,), float(rank), dtype=torch.float64))
        dist.barrier()
    path = Path(out) / f"gloo_rank{rank}.pt.trace.json"
    prof.export_chrome_trace(str(path))
    with path.open("rb") as src, gzip.open(f"{path}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    dist.destroy_process_group()


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    mp.spawn(_worker, args=(_free_port(), out), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
