"""The dashboard in a real headless browser (Chromium through WebDriver), checked as a
person would look: the GPU grid, a job appearing in the table and changing on cancel,
a job's allocation history, its goodput estimate against its reported throughput and
a restart with its measured cost, and what a tenant's dashboard leaves out. Every wait
has a hard limit; none is timed."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from conftest import rigid, spec, until

from sia_grpc.api import OTHER_TENANT, pb

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(120)]

def count(selector: str) -> str:
    """JavaScript: how many elements match `selector`."""
    return f"document.querySelectorAll({json.dumps(selector)}).length"


HOLDERS = """return Array.from(document.querySelectorAll(
    `.gputype[data-type="${arguments[0]}"] .gpu`)).map((c) => c.dataset.job);"""


async def running(client, job_id: str, gpus: int) -> None:
    async def holds() -> bool:
        job = await client.get(job_id)
        return job.status.state == pb.JOB_STATE_RUNNING and \
            job.status.allocation.num_gpus == gpus
    await until(holds, f"{job_id} to run on {gpus} GPUs")


async def test_the_grid_shows_every_gpu_by_type_and_who_holds_it(site, browser):
    dash = await site.dashboard("admin")
    admin = await site.client("admin")
    await browser.get(dash.url)
    assert await browser.js(HOLDERS, "rtx") == [""] * 8
    assert await browser.js(HOLDERS, "aws") == [""] * 2
    job = (await admin.submit(rigid("grid", 4, "rtx"))).job_id
    # The page is not reloaded: the grid changes as the dashboard pushes it.
    await browser.until(count(f'.gputype[data-type="rtx"] .gpu[data-job="{job}"]') + " === 4",
                        "the job's 4 rtx GPUs in the grid")
    rtx = await browser.js(HOLDERS, "rtx")
    assert sorted(rtx) == [""] * 4 + [job] * 4
    assert await browser.js(HOLDERS, "aws") == [""] * 2
    assert await browser.js("""return document.querySelector(
        '.gputype[data-type="rtx"] .free').textContent""") == "4"
    (cell,) = set(await browser.js("""return Array.from(document.querySelectorAll(
        `.gpu[data-job="${arguments[0]}"]`)).map((c) => c.textContent);""", job))
    assert cell == "grid"  # the job's name, in its cells


async def test_a_submitted_job_appears_and_a_cancel_changes_its_row(site, browser):
    dash = await site.dashboard("admin")
    admin = await site.client("admin")
    await browser.get(dash.url + "jobs")
    job = (await admin.submit(spec("appears"))).job_id
    row = f'document.querySelector(`#jobs tr[data-job="{job}"]`)'
    await browser.until(row, "the new job's row")
    await browser.until(f"{row}.dataset.state !== 'QUEUED'", "the job to leave QUEUED")
    await admin.cancel(job)
    await browser.until(f"{row}.dataset.state === 'CANCELLED'", "the row to say CANCELLED")
    assert await browser.js(f"return {row}.querySelector('td.state').textContent") \
        == "CANCELLED"
    # The filter hides what does not match, and keeps hiding it as rows change.
    other = (await admin.submit(spec("other"))).job_id
    await browser.until(f'document.querySelector(`#jobs tr[data-job="{other}"]`)', "row 2")
    await browser.js("""const f = document.getElementById('filter');
        f.value = 'appears'; f.dispatchEvent(new Event('input'));""")
    shown = """return Array.from(document.querySelectorAll('#jobs tbody tr'))
        .filter((tr) => !tr.hidden).map((tr) => tr.dataset.job);"""
    assert await browser.js(shown) == [job]
    assert "q=appears" in await browser.js("return location.hash")


async def test_a_job_page_draws_its_allocation_history_rates_and_restarts(site, browser):
    dash = await site.dashboard("admin")
    admin = await site.client("admin")
    job = (await admin.submit(rigid("history", 2, "rtx"))).job_id
    await until(lambda: job in dash.model.jobs, "the job on the dashboard")
    await browser.get(dash.url + f"jobs/{job}")
    step = 'document.querySelector(\'svg.alloc rect.alloc-step[data-type="rtx"]\')'
    await browser.until(step, "a step of the allocation chart")
    assert await browser.js(f"return {step}.dataset.gpus") == "2"
    assert await browser.js(f"return {step}.getBBox().height") > 0
    await browser.until("document.querySelectorAll('#notes li time').length > 0",
                        "the decisions' reasons")
    assert (await browser.js("return document.getElementById('why').textContent")).strip()
    # Its estimated goodput and the throughput its workers report, once they do (a
    # line that rises from 0).
    line = "document.querySelector('polyline.rate[data-series=\"{}\"]')"
    await browser.until(f"{line.format('throughput')}?.getBBox().height > 0",
                        "the reported throughput in the chart")
    assert await browser.js(f"return {line.format('goodput')}.getBBox().width") > 0
    assert await browser.js("""return Array.from(document.querySelectorAll(
        '.legend.rates span[data-series]')).map((s) => s.dataset.series);""") == [
        "goodput", "throughput"]
    # Moved to the other rtx node (its own drained): a restart, and what it cost.
    held = (await admin.get(job)).status.allocation.gpus
    await admin.drain(held[0].node, "move it")
    row = "document.querySelector('#restarts tr.restart')"
    await browser.until(f"{row}?.querySelector('td.cost').textContent.endsWith(' s')",
                        "the restart's measured cost")
    cells = await browser.js(f"""return Array.from({row}.cells).map((c) => c.textContent);""")
    assert cells[1:3] == ["2 rtx", "2 rtx"]
    assert float(cells[3].removesuffix(" s")) == pytest.approx(
        (await admin.get(job)).status.restart_seconds, abs=0.051)  # (shown to 0.1 s)


async def test_a_tenants_dashboard_does_not_show_another_tenants_jobs(site, browser):
    dash = await site.dashboard("a")
    a, b = await site.client("a"), await site.client("b")
    theirs = (await b.submit(rigid("theirs", 2, "rtx"))).job_id
    ours = (await a.submit(rigid("ours", 1, "rtx"))).job_id
    await running(b, theirs, 2)
    await running(a, ours, 1)
    await browser.get(dash.url)
    await browser.until(count(f'.gpu[data-job="{OTHER_TENANT}"]') + " === 2",
                        "team-b's GPUs, unnamed")
    await browser.until(count(f'.gpu[data-job="{ours}"]') + " === 1", "team-a's GPU")
    assert theirs not in await browser.js("return document.body.innerHTML")
    await browser.get(dash.url + "jobs")
    assert await browser.js("""return Array.from(document.querySelectorAll(
        '#jobs tbody tr')).map((tr) => tr.dataset.job);""") == [ours]


RESEARCH = """
[[queue]]
name = "research"
tenants = ["team-a"]
guarantee = {rtx = 4}
"""


@pytest.mark.parametrize("site", [RESEARCH], indirect=True)
async def test_a_queues_chart_shows_its_guarantee_line_and_what_it_held_after_a_round(
        site, browser):
    dash = await site.dashboard("admin")
    a = await site.client("a")
    await browser.get(dash.url + "queues")
    await browser.until("opened", "the page's event stream")
    chart = ('.queue-use[data-queue="research"] '
             'svg[aria-label="queue research: rtx GPUs held over time"]')
    guarantee = f"document.querySelector('{chart} polyline.guarantee')"
    await browser.until(guarantee, "the research queue's rtx chart")
    assert await browser.js(f"return {guarantee}.dataset.guarantee") == "4"
    assert await browser.js(f"return {guarantee}.getBBox().width") > 0
    job = (await a.submit(rigid("held", 2, "rtx", queue="research"))).job_id
    await running(a, job, 2)
    # Not reloaded: the chart grows a bar of the 2 GPUs the round gave the queue.
    held = f"document.querySelector('{chart} rect.held[data-held=\"2\"]')"
    await browser.until(held, "the queue's 2 rtx GPUs in its chart")
    assert await browser.js(f"return {held}.getBBox().height") > 0
    assert await browser.js(f"return document.querySelector('{chart} polyline.held-line')"
                            ".getBBox().height") > 0
    caption = await browser.js(f"return document.querySelector('{chart}')"
                               ".closest('figure').querySelector('figcaption').textContent")
    assert caption == "rtx GPUs: 2 held of 4 guaranteed"


async def test_a_round_lists_the_job_it_moved_and_its_link_opens_the_job_page(site, browser):
    dash = await site.dashboard("admin")
    admin = await site.client("admin")
    job = (await admin.submit(rigid("mover", 2, "rtx"))).job_id
    await running(admin, job, 2)
    await until(lambda: any(m.job_id == job for r in dash.model.rounds for m in r.moves),
                "the round that started it on the dashboard")  # (then drawn with the page)
    await browser.get(dash.url + "rounds")
    await browser.until("opened", "the page's event stream")
    started = f'#rounds li.move[data-job="{job}"][data-kind="start"]'
    await browser.until(f"document.querySelector('{started}')", "the round that started it")
    (node,) = {g.node for g in (await admin.get(job)).status.allocation.gpus}
    await admin.drain(node, "move it")
    # The drain's round arrives over the event stream: the page is not reloaded.
    moved = f'#rounds li.move[data-job="{job}"][data-kind="move"]'
    await browser.until(f"document.querySelector('{moved}')", "the round that moved it")
    number, trigger, before, after = await browser.js(f"""
        const li = document.querySelector('{moved}'), row = li.closest('tbody');
        return [row.dataset.round, row.querySelector('tr.round').cells[2].textContent,
                li.querySelector('.from').textContent, li.querySelector('.to').textContent];""")
    (rnd,) = [r for r in await admin.rounds(limit=50) if r.round == int(number)]
    assert trigger == rnd.trigger and before == f"2 rtx on {node}"
    assert after.startswith("2 rtx on ") and node not in after
    await browser.js(f"document.querySelector('{moved} a').click();")
    path = "/jobs/" + quote(job, safe="")  # a scoped id's '/' is quoted
    await browser.until(f"location.pathname === '{path}'", "the job's page")
    await browser.until("document.readyState === 'complete'", "the job's page to load")
    assert job in await browser.js("return document.querySelector('h1').textContent")


async def test_the_dashboard_benchmark_runs_end_to_end_at_a_tiny_size():
    from sia_grpc.bench.dashboard import measure
    from sia_grpc.testing.browser import unavailable

    if why := unavailable():
        pytest.skip(f"browser: {why}")

    result = await measure(jobs=6, samples=2)
    assert result["rows_on_page"] == 6 + 2
    assert result["event_to_screen_ms"]["n"] == 2
    assert set(result["pages"]) == {"jobs", "cluster"}
