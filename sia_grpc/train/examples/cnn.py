"""A small CNN on generated 12x12 stroke images (4 classes), trained with Adam
(square-root LR scaling).

    python -m sia_grpc.train.examples.cnn [--epochs 4] [--batch-size 32]

Each image holds one noisy stroke at a random place: horizontal, vertical,
diagonal or anti-diagonal; the net must find its orientation.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import TensorDataset

import sia_grpc.train as st

SIZE = 12


def make_dataset(n: int = 4096, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.6 * torch.randn(n, 1, SIZE, SIZE, generator=g)
    length = 6
    r0 = torch.randint(0, SIZE - length, (n,), generator=g)
    c0 = torch.randint(0, SIZE - length, (n,), generator=g)
    steps = torch.arange(length)
    for i in range(n):
        r, c = int(r0[i]), int(c0[i])
        kind = int(y[i])
        rows = {0: r + 0 * steps, 1: r + steps, 2: r + steps, 3: r + length - 1 - steps}[kind]
        cols = {0: c + steps, 1: c + 0 * steps, 2: c + steps, 3: c + steps}[kind]
        x[i, 0, rows, cols] += 1.5
    return TensorDataset(x, y)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Linear(16 * 3 * 3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=4096, help="dataset size (generated)")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    st.init()
    torch.manual_seed(args.seed)
    data = make_dataset(n=args.samples, seed=args.seed)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model = st.AdaptiveDataParallel(model, optimizer)
    loader = st.AdaptiveDataLoader(data, batch_size=args.batch_size, seed=args.seed)

    for epoch in st.remaining_epochs_until(args.epochs):
        total = correct = 0
        loss_sum = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            total += len(y)
        if st.rank() == 0 and total:
            print(f"epoch {epoch}: loss {loss_sum / total:.4f} accuracy {correct / total:.3f} "
                  f"batch {loader.current_batch_size} progress {st.progress():.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
