"""A nanoGPT-shaped character model trained on CPU: the workload of bench_profile_memory.py.

    python benchmarks/programs/gpt_char.py --iters 300 [--manual-profiler]

The shape of karpathy/nanoGPT's `train_shakespeare_char` config shrunk for a CPU (4 layers
keep the op count per step, which is what profiling memory grows with; small widths keep a
step quick): causal self-attention blocks (LayerNorm, attention, MLP), AdamW, a random
character corpus, one optimizer step per iteration and no gpudiag markers.
`--manual-profiler` wraps the loop in torch.profiler with the options gpudiag's torch
backend uses (what a user would write by hand), exporting one trace at the end. Prints one
JSON line: iterations, loop seconds, seconds per step after 5 warm-up steps.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.ones(length, length, dtype=torch.bool).tril()
        attended = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        return self.head(self.norm(self.blocks(x)))


def prepare_corpus(seconds: float, vocab: int) -> torch.Tensor:
    """A start-up like HuggingFace's `run_clm` before its first step: text tokenized in
    Python (many small calls) and each example turned into a tensor, for `seconds`."""
    words = [f"w{i % 997}" for i in range(64)]
    examples: collections.deque[torch.Tensor] = collections.deque(maxlen=1000)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        ids = [sum(map(ord, word)) % vocab for word in words]
        examples.append(torch.tensor(ids, dtype=torch.long).clamp_(0, vocab - 1))
    return torch.cat(list(examples))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--manual-profiler", action="store_true")
    parser.add_argument("--startup-s", type=float, default=0.0,
                        help="Seconds of start-up work before the model is built.")
    args = parser.parse_args()
    torch.manual_seed(0)
    vocab, block, batch = 65, 32, 8
    data = torch.randint(vocab, (200_000,))
    if args.startup_s:
        data = torch.cat([data, prepare_corpus(args.startup_s, vocab)])
    model = CharGPT(vocab, block, width=48, layers=4, heads=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    profiler = nullcontext()
    if args.manual_profiler:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                          record_shapes=True, with_stack=True,
                                          profile_memory=True)
    ends = []
    start = time.perf_counter()
    with profiler:
        for _ in range(args.iters):
            offsets = torch.randint(len(data) - block - 1, (batch,))
            x = torch.stack([data[o:o + block] for o in offsets])
            y = torch.stack([data[o + 1:o + block + 1] for o in offsets])
            loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            ends.append(time.perf_counter())
    loop_s = time.perf_counter() - start
    if args.manual_profiler:
        with tempfile.TemporaryDirectory() as tmp:
            profiler.export_chrome_trace(str(Path(tmp) / "trace.json"))  # type: ignore[attr-defined]
    steady = [b - a for a, b in itertools.pairwise(ends[5:])]
    print(json.dumps({"iters": args.iters, "loop_s": loop_s,
                      "step_s": sorted(steady)[len(steady) // 2] if steady else None}),
          file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
