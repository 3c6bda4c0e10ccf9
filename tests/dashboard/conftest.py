"""A live controller with modeled agents (LocalCluster over loopback, faster than real
time, as tests/client/test_client_live.py starts it), tokens for two tenants and an
admin, and dashboards on ephemeral ports; for the browser tests, headless Chromium
through Debian's chromedriver (`make browser` installs both as root; without them
those tests skip, saying why)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.dashboard import Dashboard
from sia_grpc.security.tokens import add_token
from sia_grpc.testing import browser
from sia_grpc.testing.localcluster import LocalCluster

RATE = 120.0
CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True)
NODES = {"rtx": (2, 4), "aws": (1, 2)}  # 8 rtx GPUs on two nodes, 2 aws on one
WAIT = 30.0  # the hard limit on waiting for anything to show


def spec(name: str = "ncf", app: str = "ncf", **kw: Any) -> pb.JobSpec:
    return pb.JobSpec(name=name, application=app, adaptivity=pb.ADAPTIVITY_ADAPTIVE, **kw)


def rigid(name: str, gpus: int, gpu_type: str, **kw: Any) -> pb.JobSpec:
    """A job that holds exactly `gpus` GPUs of `gpu_type` once it runs (a count the
    type offers: 1, 2 or a whole node), for a long while (imagenet: 90 epochs)."""
    return pb.JobSpec(name=name, application="imagenet", adaptivity=pb.ADAPTIVITY_RIGID,
                      num_gpus=gpus, batch_size=64 * gpus, allowed_gpu_types=[gpu_type], **kw)


async def until(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Wait for `predicate()` (a value or an awaitable) to be truthy; fail after
    `timeout` seconds, saying what was awaited."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                value = predicate()
                if asyncio.iscoroutine(value):
                    value = await value
                if value:
                    return value
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class Site:
    """A controller with agents and its tokens; `dashboard(token)` starts one more."""

    lc: LocalCluster
    tokens: dict[str, str]  # "a", "b" (tenants team-a, team-b), "admin"
    stack: contextlib.AsyncExitStack

    async def client(self, who: str = "admin") -> AsyncSiaClient:
        return await self.stack.enter_async_context(
            AsyncSiaClient(self.lc.target, token=self.tokens[who], timeout=10))

    async def dashboard(self, who: str = "admin", **kw: Any) -> Dashboard:
        client = await self.client(who)
        dash = Dashboard(client, listen="127.0.0.1:0", clock=self.lc.controller.clock.time,
                         **kw)
        await self.stack.enter_async_context(dash)
        await until(lambda: dash.model.upstream == "live" and dash.model.cluster.nodes,
                    "the dashboard to reach the controller")
        return dash


@pytest.fixture
async def site(tmp_path, request) -> AsyncIterator[Site]:
    """The controller and its agents; with `@pytest.mark.parametrize("site", [TOML],
    indirect=True)`, with that queues configuration."""
    tokens_file = tmp_path / "tokens.toml"
    tokens = {"a": add_token(tokens_file, "team-a"), "b": add_token(tokens_file, "team-b"),
              "admin": add_token(tokens_file, "ops", admin=True)}
    config = replace(CONFIG, tokens_file=str(tokens_file), db_path=str(tmp_path / "sia.db"))
    if queues := getattr(request, "param", None):
        (tmp_path / "queues.toml").write_text(queues)
        config = replace(config, queues_file=str(tmp_path / "queues.toml"))
    async with contextlib.AsyncExitStack() as stack:
        lc = await stack.enter_async_context(
            LocalCluster(NODES, rate=RATE, config=config, telemetry_interval=0.05))
        await lc.wait_registered(sum(n for n, _ in NODES.values()))
        yield Site(lc, tokens, stack)


# -- the browser --------------------------------------------------------------------------

class Browser:
    """Headless Chromium through WebDriver; each call runs in a thread, since the
    controller and the dashboard run on this test's event loop."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def get(self, url: str) -> None:
        await asyncio.to_thread(self.driver.get, url)
        await self.until("document.readyState === 'complete'", "the page to load")

    async def js(self, script: str, *args: Any) -> Any:
        return await asyncio.to_thread(self.driver.execute_script, script, *args)

    async def until(self, expr: str, what: str, timeout: float = WAIT) -> Any:
        """Wait (hard limit `timeout`) for the JavaScript expression to be truthy."""
        return await until(lambda: self.js(f"return ({expr});"), what, timeout)

@pytest.fixture(scope="module")
def chromium() -> Any:
    reason = browser.unavailable()
    if reason is not None:
        pytest.skip(f"browser: {reason}")
    driver = browser.chrome(1280, 860)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(name="browser")
def browser_fixture(chromium) -> Browser:
    return Browser(chromium)
