"""A 2-rank DDP training job on CPU with gloo, shaped like the DDP tutorial series' script.

    torchrun --standalone --nproc-per-node 2 tests/programs/ddp_gloo.py EPOCHS

No gpudiag markers: the profiler must find the steps, and end by itself (issue 11's gloo
teardown deadlock happened in `destroy_process_group` while torch.profiler was on).
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main(epochs: int) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 20), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for source, target in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(source), target)
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
