"""A small training job for the tests, run as `python worker_script.py` with the
agent's environment. It logs every micro-batch it trains on (one JSON line:
epoch, dataset indices, loss, step, shape) to $TEST_LOG_DIR/gen<G>-rank<R>.jsonl.

Knobs (environment): TEST_N samples (480), TEST_B0 initial batch (16),
TEST_EPOCHS (3), TEST_STEP_SLEEP seconds per micro-step (0), TEST_OOM_AT: raise
torch.OutOfMemoryError on a micro-batch of at least this size (0 = never),
TEST_OPTIM sgd|adam, TEST_LR (SGD, 0.05).
"""

from __future__ import annotations

import json
import os
import time

import torch

import sia_grpc.train as st


class Indexed(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        w = torch.randn(8, 1, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def main() -> None:
    env = os.environ
    torch.set_num_threads(1)
    st.init()
    torch.manual_seed(1)
    n = int(env.get("TEST_N", "480"))
    sleep = float(env.get("TEST_STEP_SLEEP", "0"))
    oom_at = int(env.get("TEST_OOM_AT", "0"))
    model = torch.nn.Linear(8, 1)
    if env.get("TEST_OPTIM", "sgd") == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=float(env.get("TEST_LR", "0.05")))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model = st.AdaptiveDataParallel(model, opt, sched)
    loader = st.AdaptiveDataLoader(Indexed(n), batch_size=int(env.get("TEST_B0", "16")), seed=1)
    path = os.path.join(env["TEST_LOG_DIR"],
                        f"gen{env.get('SIA_GENERATION', '0')}-rank{st.rank()}.jsonl")
    with open(path, "a") as log:
        for epoch in st.remaining_epochs_until(float(env.get("TEST_EPOCHS", "3"))):
            for x, y, idx in loader:
                if oom_at and len(idx) >= oom_at:
                    raise torch.OutOfMemoryError("test: pretending to be out of memory")
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                step = loader.current_step
                opt.step()
                log.write(json.dumps({
                    "epoch": epoch, "idx": idx.tolist(), "loss": loss.item(), "step": step,
                    "atomic": loader.current_local_bsz, "accum": loader.accumulation_steps,
                    "batch": loader.current_batch_size,
                    "shape": [loader.step_shape.atomic, loader.step_shape.accum],
                    "lr": opt.param_groups[0]["lr"],
                    "sqr_var": list(model.grad_stats)}) + "\n")
                log.flush()
                if sleep:
                    time.sleep(sleep)
            sched.step()


if __name__ == "__main__":
    main()
