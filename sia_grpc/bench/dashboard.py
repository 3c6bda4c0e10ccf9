"""`sia bench dashboard`: what the dashboard costs with many jobs, in a real browser.

A controller with modeled agents (4 nodes × 8 rtx GPUs, real time) on loopback gets
`jobs` jobs; a dashboard serves them; headless Chromium (`make browser`) then

- loads the jobs page (all the jobs' rows) and the cluster page a few times: the
  navigation's response end (the server drawing the page, and the transfer) and load
  event (the browser parsing, drawing, and the page's script sorting and filtering),
  from the Navigation Timing API;
- measures event-to-screen latency: `samples` more jobs are created one at a time,
  each timed from just before its CreateJob to the moment its row is put in the open
  jobs page (a MutationObserver's Date.now(), the same clock as time.time() here).
  That covers the controller's commit, the WatchJobs event, the dashboard's model and
  drawing, the server-sent event and the page's script, while the other jobs'
  profiling and rounds go on.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
from typing import Any

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.dashboard import Dashboard
from sia_grpc.testing import browser
from sia_grpc.testing.localcluster import LocalCluster

NODES = {"rtx": (4, 8)}
LOADS = 5  # page loads measured per page

# Records when each row first appears in the jobs table (its job id -> Date.now()).
_OBSERVE = """
window.__seen = {};
new MutationObserver((changes) => {
  const now = Date.now();
  for (const c of changes) for (const n of c.addedNodes) {
    if (n.dataset && n.dataset.job && !(n.dataset.job in window.__seen)) {
      window.__seen[n.dataset.job] = now;
    }
  }
}).observe(document.querySelector('#jobs tbody'), {childList: true});
"""
_TIMING = """const t = performance.getEntriesByType('navigation')[0];
return [t.responseEnd - t.startTime, t.loadEventEnd - t.startTime, t.transferSize];"""


def _spec(k: int) -> pb.JobSpec:
    return pb.JobSpec(name=f"bench-{k}", application=("ncf", "cifar10", "bert")[k % 3],
                      adaptivity=pb.ADAPTIVITY_ADAPTIVE, tenant=f"team-{k % 4}")


def _summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"p50": statistics.median(values),
            "p95": values[min(len(values) - 1, int(0.95 * len(values)))],
            "max": values[-1], "n": len(values)}


async def _until(predicate: Any, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.01)


async def measure(jobs: int = 1000, samples: int = 30) -> dict[str, Any]:
    config = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:")
    async with LocalCluster(NODES, config=config) as lc, AsyncSiaClient(lc.target) as client:
        await lc.wait_registered(sum(n for n, _ in NODES.values()))
        for start in range(0, jobs, 50):
            await asyncio.gather(*(client.submit(_spec(k))
                                   for k in range(start, min(start + 50, jobs))))
        async with Dashboard(client, listen="127.0.0.1:0") as dash:
            async def all_shown() -> bool:
                return len(dash.model.jobs) >= jobs
            await _until(all_shown, 120)
            driver = await asyncio.to_thread(browser.chrome)
            try:
                return await _in_browser(driver, dash, client, jobs, samples)
            finally:
                await asyncio.to_thread(driver.quit)


async def _in_browser(driver: Any, dash: Dashboard, client: AsyncSiaClient, jobs: int,
                      samples: int) -> dict[str, Any]:
    def js(script: str, *args: Any) -> Any:
        return asyncio.to_thread(driver.execute_script, script, *args)

    loads: dict[str, dict[str, Any]] = {}
    for page in ("jobs", ""):
        timings = []
        for _ in range(LOADS):
            await asyncio.to_thread(driver.get, dash.url + page)
            await _until(lambda: js("return document.readyState === 'complete'"), 60)
            timings.append(await js(_TIMING))
        loads[page or "cluster"] = {
            "response_ms": _summary([t[0] for t in timings]),
            "load_ms": _summary([t[1] for t in timings]), "bytes": timings[-1][2]}
    await asyncio.to_thread(driver.get, dash.url + "jobs")
    await js(_OBSERVE)
    latencies = []
    for k in range(samples):
        sent = time.time()
        # (the id the controller gives: scoped by the token's tenant)
        job_id = (await client.submit(_spec(jobs + k), job_id=f"latency-{k}")).job_id
        await _until(lambda j=job_id: js("return window.__seen[arguments[0]] !== undefined", j),
                     30)
        latencies.append(await js("return window.__seen[arguments[0]]", job_id) - sent * 1e3)
    rows = await js("return document.querySelectorAll('#jobs tbody tr').length")
    return {"jobs": jobs, "rows_on_page": rows, "pages": loads,
            "event_to_screen_ms": _summary(latencies), "events_published": dash.hub.published,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                       f"{platform.python_implementation()} {platform.python_version()}"}


def run(*, jobs: int, samples: int, as_json: bool) -> int:
    from sia_grpc.observability import configure_logging

    configure_logging(level="error")  # (the embedded services: only the results printed)
    result = asyncio.run(measure(jobs, samples))
    if as_json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"sia bench dashboard: {result['jobs']} jobs ({result['rows_on_page']} rows on the "
          f"jobs page), {result['machine']}")
    for page, t in result["pages"].items():
        r, ld = t["response_ms"], t["load_ms"]
        print(f"  {page:8s} page load: response {r['p50']:.0f} ms (p95 {r['p95']:.0f}), "
              f"load event {ld['p50']:.0f} ms (p95 {ld['p95']:.0f}), {t['bytes'] / 1e3:.0f} kB")
    lat = result["event_to_screen_ms"]
    print(f"  CreateJob to its row on screen: p50 {lat['p50']:.0f} ms, p95 {lat['p95']:.0f} "
          f"ms, max {lat['max']:.0f} ms over {lat['n']} jobs")
    return 0
