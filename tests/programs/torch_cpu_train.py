"""A tiny CPU training loop shaped like pytorch/examples mnist: a Dataset, a DataLoader, a
small CNN, Adam. No gpudiag markers: the steps must be found from the optimizer steps.

    python tests/programs/torch_cpu_train.py [EPOCHS]
    python tests/programs/torch_cpu_train.py 1 --trace OUT.pt.trace.json   # torch.profiler

`--trace` wraps the loop in torch.profiler (CPU activity, profile_memory, no stacks) and
exports the Kineto JSON: how tests/data/torch_cpu_train.pt.trace.json.gz was recorded.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):  # type: ignore[type-arg]
    """Random 28x28 images, normalized per item in Python as torchvision's transforms do."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, 28, 28, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.x[i] - 0.1307) / 0.3081, self.y[i]


def train(epochs: int, batches: int) -> None:
    torch.manual_seed(0)
    loader = DataLoader(Digits(32 * batches), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(8 * 13 * 13, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("epochs", type=int, nargs="?", default=1)
    parser.add_argument("--batches", type=int, default=12, help="batches per epoch")
    parser.add_argument("--trace", help="record with torch.profiler into this Kineto JSON")
    args = parser.parse_args()
    profiler: Any = contextlib.nullcontext()
    if args.trace:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                          profile_memory=True)
    with profiler:
        train(args.epochs, args.batches)
    if args.trace:
        profiler.export_chrome_trace(args.trace)


if __name__ == "__main__":
    main()
