"""An MLP on a generated 8-class Gaussian mixture, trained with SGD (AdaScale).

    python -m sia_grpc.train.examples.mlp [--epochs 6] [--batch-size 64]

The classes overlap, so accuracy tops out below 0.9: the loss
has something to learn for several epochs, and gradient noise is real.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import TensorDataset

import sia_grpc.train as st


def make_dataset(n: int = 8192, dim: int = 16, classes: int = 8, seed: int = 0
                 ) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    centers = 0.7 * torch.randn(classes, dim, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, dim, generator=g)
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64, help="hidden layer width")
    p.add_argument("--samples", type=int, default=8192, help="dataset size (generated)")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    st.init()
    # The replica's GPU when there is one (st.init selected cuda:LOCAL_RANK), else the CPU.
    device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
              else torch.device("cpu"))
    torch.manual_seed(args.seed)  # the same initial model on every replica
    data = make_dataset(n=args.samples, seed=args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 8)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    model = st.AdaptiveDataParallel(model, optimizer, scheduler)
    loader = st.AdaptiveDataLoader(data, batch_size=args.batch_size, seed=args.seed)

    for epoch in st.remaining_epochs_until(args.epochs):
        total = correct = 0
        loss_sum = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            total += len(y)
        scheduler.step()
        if st.rank() == 0 and total:
            print(f"epoch {epoch}: loss {loss_sum / total:.4f} accuracy {correct / total:.3f} "
                  f"batch {loader.current_batch_size} progress {st.progress():.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
