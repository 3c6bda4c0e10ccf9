"""Screenshots of the dashboard's pages for docs/img (docs/dashboard.md, the README).

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/img]

Starts `sia demo --modeled`'s cluster (a controller and modeled agents of three GPU
types on loopback, 120x faster than real time), submits that demo's trace and a few
longer jobs at once (four tenants in three queues), serves the dashboard on an
ephemeral port, lets the rounds scale and move the jobs for a while, and has headless
Chromium (Debian's chromium and chromedriver: `make browser`) take each page at
1280x800, a laptop's screen (a job's page and the queues whole: their charts are below).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.dashboard import Dashboard
from sia_grpc.demo.modeled import LIVE_CLUSTER, LIVE_TRACE, live_spec
from sia_grpc.testing.browser import chrome
from sia_grpc.testing.localcluster import LocalCluster

SETTLE_S = 12.0  # real seconds of rounds before the pictures (24 cluster minutes)
# The window's height for the pages that are longer than a laptop's screen (a job's
# page, the queues with their charts over time): all of them.
HEIGHTS = {"job": 1500, "queues": 1250}
# Longer jobs beside the demo's trace, so that the pictures show a busy cluster.
LONG = (("imagenet", "adaptive"), ("yolov3", "adaptive"), ("yolov3", "rigid"),
        ("imagenet", "adaptive"))
TENANTS = {"cifar10": "vision", "imagenet": "vision", "yolov3": "vision", "bert": "nlp",
           "deepspeech2": "speech", "ncf": "recsys"}
QUEUE_OF = {"vision": "research", "nlp": "product", "speech": "infra", "recsys": "infra"}
# Three queues that guarantee two thirds of the 24 GPUs (docs/operations.md, "Queues").
QUEUES = """
[[queue]]
name = "research"
guarantee = {aws = 4, rtx = 4, dgx-ext = 4}

[[queue]]
name = "product"
guarantee = {aws = 2, rtx = 2, dgx-ext = 2}

[[queue]]
name = "infra"
guarantee = {aws = 1, rtx = 1}
"""


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    queues = Path(tempfile.mkdtemp(prefix="sia-shots-")) / "queues.toml"
    queues.write_text(QUEUES)
    config = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:",
                              queues_file=str(queues))
    async with LocalCluster(LIVE_CLUSTER, rate=120.0, config=config) as lc, \
            AsyncSiaClient(lc.target) as client:
        await lc.wait_registered(sum(n for n, _ in LIVE_CLUSTER.values()))
        trace = [(app, kind) for _, app, kind in LIVE_TRACE] + list(LONG)
        for k, (app, kind) in enumerate(trace):
            spec = live_spec(k, app, kind)
            spec.tenant = TENANTS[app]
            spec.queue = QUEUE_OF[spec.tenant]
            await client.submit(spec)
        async with Dashboard(client, listen="127.0.0.1:0",
                             clock=lc.controller.clock.time) as dash:
            await asyncio.sleep(SETTLE_S)
            # The job the rounds changed most: the richest history to show.
            busiest = max(dash.model.jobs.values(), key=lambda r: (
                len(r.restarts), len(r.history))).job.job_id
            driver = await asyncio.to_thread(chrome)
            try:
                for name, path in (("cluster", ""), ("jobs", "jobs"),
                                   ("job", f"jobs/{busiest}"), ("rounds", "rounds"),
                                   ("queues", "queues")):
                    await asyncio.to_thread(driver.set_window_size, 1280,
                                            HEIGHTS.get(name, 800))
                    await asyncio.to_thread(driver.get, dash.url + path)
                    await asyncio.sleep(0.5)  # (the first events drawn)
                    await asyncio.to_thread(driver.save_screenshot,
                                            str(out / f"dashboard-{name}.png"))
                    print(out / f"dashboard-{name}.png")
            finally:
                await asyncio.to_thread(driver.quit)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    asyncio.run(main(parser.parse_args().out))
