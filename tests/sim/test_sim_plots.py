"""Plots of small hand-built runs: each writes a real PNG, also with nothing finished;
the figures' structure (panels, shared axes, capacity lines, titles) is checked on
the matplotlib objects before saving."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.sim import plots
from sia_grpc.sim.plots.allocation import UNATTRIBUTED
from sia_grpc.sim.records import JobRecord, RoundRecord, SimResult

PNG = b"\x89PNG\r\n\x1a\n"
H = 3600.0
CAPACITY = {"a100": 8, "t4": 16}


def is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 100 and data[:8] == PNG


def result(policy="sia", workload="helios-1", *, finished=True) -> SimResult:
    jobs = tuple(
        JobRecord(name=f"j{i}", application="bert", category="adaptive",
                  submit_time=i * 600.0, start_time=i * 600.0 + 60.0,
                  finish_time=(i * 600.0 + (i + 1) * 1800.0) if finished else None,
                  gpu_seconds=(i + 1) * 7200.0, restarts=i % 2,
                  isolated_jct=(i + 1) * 1500.0 if i % 3 else None)
        for i in range(6))
    rounds = tuple(
        RoundRecord(time=k * 60.0, policy_seconds=0.01, active_jobs=min(6, k + 1),
                    gpus_in_use={"a100": min(8, 2 * k), "t4": min(16, k)})
        for k in range(60))
    return SimResult(workload=workload, policy=policy, cluster="het-24",
                     capacity=dict(CAPACITY), jobs=jobs, rounds=rounds)


def run(policy: str, *, rounds: int, round_s: float, workload="saturn/w1") -> SimResult:
    """A run with per-job allocations: a bert job on 2 a100 for the whole run, a
    cifar10 job on 4 t4 for the first half only (so the t4 type empties)."""
    jobs = (JobRecord("b", "bert", "adaptive", 0.0, 0.0, rounds * round_s, 0.0, 0),
            JobRecord("c", "cifar10", "adaptive", 0.0, 0.0, rounds * round_s / 2, 0.0, 0))
    recs = []
    for k in range(rounds):
        alloc = {"b": ("a100", 2)} | ({"c": ("t4", 4)} if k < rounds // 2 else {})
        in_use = {"a100": 2, "t4": 4 if k < rounds // 2 else 0}
        recs.append(RoundRecord(k * round_s, 0.01, len(alloc), in_use, alloc))
    return SimResult(workload=workload, policy=policy, cluster="het-24",
                     capacity=dict(CAPACITY), jobs=jobs, rounds=tuple(recs))


def by_policy():
    return {"sia": [result("sia", "w1"), result("sia", "w2")],
            "gavel": [result("gavel", "w1", finished=False)]}


def limit_line(ax):
    (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == "limit"]
    return line


def test_jct_cdf(tmp_path):
    path = plots.jct_cdf(by_policy(), tmp_path / "jct.png")
    assert path == tmp_path / "jct.png" and is_png(path)


def test_ftf_cdf(tmp_path):
    assert is_png(plots.ftf_cdf(by_policy(), tmp_path / "ftf.png"))


def test_cdf_figures_name_workloads_cluster_and_units():
    one = {"sia": [run("sia", rounds=10, round_s=60)],
           "gavel": [run("gavel", rounds=4, round_s=360)]}
    (ax,) = plots.jct_cdf_figure(one).axes
    assert ax.get_title() == "JCT CDF\nsaturn/w1, cluster het-24"
    assert "hours" in ax.get_xlabel() and ax.get_ylabel() == "fraction of jobs"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "sia (2 jobs)", "gavel (2 jobs)"]
    pooled = {"sia": [run("sia", rounds=10, round_s=60, workload=w)
                      for w in ("saturn/w1", "saturn/w2", "philly/w1")]}
    (ax,) = plots.ftf_cdf_figure(pooled).axes
    assert ax.get_title() == ("Finish-time fairness CDF\nsaturn, philly (3 workloads pooled), "
                              "cluster het-24")
    assert "ratio" in ax.get_xlabel()


def test_allocation_over_time(tmp_path):
    assert is_png(plots.allocation_over_time(result(), tmp_path / "sub" / "alloc.png"))


def test_allocation_figure_has_one_panel_per_gpu_type_with_its_capacity():
    r = run("sia", rounds=10, round_s=60)
    fig = plots.allocation_figure(r)
    assert len(fig.axes) == len(CAPACITY)
    for ax, (gpu_type, cap) in zip(fig.axes, CAPACITY.items(), strict=True):
        assert ax.get_title(loc="left") == f"{gpu_type}: {cap} GPUs"
        assert np.all(limit_line(ax).get_ydata() == cap)
        assert ax.get_ylabel() == "GPUs" and ax.get_ylim()[1] > cap
    assert fig.axes[-1].get_xlabel() == "time since the trace's start (hours)"
    title = fig.get_suptitle()
    assert "sia on saturn/w1, cluster het-24" in title


def test_allocation_figures_of_one_workload_share_their_axes():
    # Sia: 10 one-minute rounds; Gavel: 4 six-minute rounds, so it ends later.
    runs = {"sia": [run("sia", rounds=10, round_s=60)],
            "gavel": [run("gavel", rounds=4, round_s=360),
                      run("gavel", rounds=2, round_s=360, workload="other")]}
    figs = {(w, p): fig for w, p, fig in plots.allocation_figures(runs)}
    assert list(figs) == [("saturn/w1", "sia"), ("saturn/w1", "gavel"), ("other", "gavel")]
    sia, gavel = figs[("saturn/w1", "sia")], figs[("saturn/w1", "gavel")]
    for a, b in zip(sia.axes, gavel.axes, strict=True):
        assert a.get_xlim() == b.get_xlim() == (0.0, 4 * 360 / H)  # the longest run's end
        assert a.get_ylim() == b.get_ylim()
    # Another workload gets its own frame.
    assert figs[("other", "gavel")].axes[0].get_xlim() == (0.0, 2 * 360 / H)


def test_panels_stack_by_application_and_stay_independent():
    r = run("sia", rounds=10, round_s=60)
    frame = plots.allocation_frame([r])
    assert frame.bin_s == 60 and list(frame.colors) == ["bert", "cifar10"]
    a100, t4 = plots.allocation_panels(r, frame)
    assert np.array_equal(a100.layers["bert"], np.full(10, 2.0))
    assert not a100.layers["cifar10"].any()
    # t4 empties halfway; the a100 panel above is unmoved by it.
    assert np.array_equal(t4.layers["cifar10"], [4.0] * 5 + [0.0] * 5)
    assert not t4.layers["bert"].any()


def test_bins_are_whole_rounds_of_the_longest_round_and_keep_gpu_hours():
    long = run("gavel", rounds=400, round_s=360)
    frame = plots.allocation_frame([long, run("sia", rounds=30, round_s=60)])
    assert frame.bin_s % 360 == 0 and len(frame.edges_h) - 1 <= 160
    a100, t4 = plots.allocation_panels(long, frame)
    width_h = frame.bin_s / H
    assert sum(a100.layers["bert"]) * width_h == pytest.approx(2 * 400 * 360 / H)
    assert sum(t4.layers["cifar10"]) * width_h == pytest.approx(4 * 200 * 360 / H)


def test_no_gpus_are_held_across_an_idle_gap():
    # The engine records no rounds while nothing is active: the round at 60 s
    # holds its GPUs for one round, not until the next recorded round at 600 s.
    job = JobRecord("b", "bert", "adaptive", 0.0, 0.0, 660.0, 0.0, 0)
    rounds = tuple(RoundRecord(t, 0.0, 1, {"a100": 2}, {"b": ("a100", 2)})
                   for t in (0.0, 60.0, 600.0))
    r = SimResult("w", "sia", "c", {"a100": 8}, (job,), rounds)
    (panel,) = plots.allocation_panels(r, plots.allocation_frame([r]))
    assert list(panel.layers["bert"]) == [2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 2]


def test_gpus_without_per_job_allocations_are_drawn_unattributed():
    r = result()  # rounds with gpus_in_use but no allocations
    frame = plots.allocation_frame([r])
    a100, t4 = plots.allocation_panels(r, frame)
    assert list(frame.colors) == ["bert", UNATTRIBUTED]
    # The last job ends at 3.8 h, so bins are two one-minute rounds; the 60 rounds
    # fill the first 30 bins.
    assert frame.bin_s == 120
    per_round = np.minimum(8, 2 * np.arange(60))
    drawn = a100.layers[UNATTRIBUTED]
    assert np.array_equal(drawn[:30], per_round.reshape(30, 2).mean(axis=1))
    assert not drawn[30:].any() and not a100.layers["bert"].any()


TINY_TRACE = """name,time,application,num_replicas,batch_size
j0,0,ncf,1,256
j1,30,cifar10,2,256
j2,90,ncf,1,512
"""


def test_a_real_run_on_the_paper_cluster(tmp_path):
    """The engine's own records: a panel per type of hetero64 with its GPU count,
    and every GPU in use attributed to a job's application."""
    from sia_grpc.policy import make_policy
    from sia_grpc.sim.clusters import load_cluster
    from sia_grpc.sim.engine import simulate
    from sia_grpc.sim.workload import load_workload

    path = tmp_path / "tiny.csv"
    path.write_text(TINY_TRACE)
    runs = {p: [simulate(load_workload(str(path)), load_cluster("hetero64"), make_policy(p),
                         workload_name=str(path), cluster_name="hetero64x1")]
            for p in ("sia", "fifo")}
    (_, _, fig), _ = plots.allocation_figures(runs)
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "aws: 24 GPUs", "dgx-ext: 16 GPUs", "rtx: 24 GPUs"]
    assert [limit_line(ax).get_ydata()[0] for ax in fig.axes] == [24, 16, 24]
    assert fig.get_suptitle().startswith(
        f"GPUs allocated by type: sia on {path.parent.name}/tiny, cluster hetero64x1")
    frame = plots.allocation_frame([r for rs in runs.values() for r in rs])
    assert list(frame.colors) == ["cifar10", "ncf"]  # nothing left unattributed
    sia = runs["sia"][0]
    drawn = sum(sum(layer.sum() for layer in p.layers.values())
                for p in plots.allocation_panels(sia, frame)) * frame.bin_s
    held = sum(sum(rnd.gpus_in_use.values()) for rnd in sia.rounds) * 60.0
    assert drawn == pytest.approx(held)


def test_step_panels_draw_a_limit_that_changes_over_time():
    # What a per-queue "GPUs held against its guarantee" figure would pass.
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    panel = plots.StepPanel(heading="queue research", layers={"held": np.array([1., 3., 2.])},
                            limit=np.array([2.0, 2.0, 4.0]), limit_label="guarantee", ymax=5)
    fig = plots.step_panels([panel], edges, title="GPUs held per queue", ylabel="GPUs",
                            colors={"held": "C0"}, xlim=(0.0, 3.0))
    (ax,) = fig.axes
    assert list(limit_line(ax).get_ydata()) == [2.0, 2.0, 4.0, 4.0]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["held", "guarantee"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 500), st.floats(0, 300), st.integers(0, 64)),
                min_size=1, max_size=30),
       st.floats(1, 400))
def test_binned_mean_keeps_the_integral(pieces, width):
    """However the bins fall, Σ mean × width over bins covering every interval is
    the series' integral."""
    starts, ends, values, t = [], [], [], 0.0
    for gap, length, v in pieces:
        starts.append(t + gap)
        ends.append(t + gap + length)
        values.append(v)
        t = ends[-1]
    edges = np.arange(0.0, t + width + 1.0, width)
    out = plots.binned_mean(np.array(starts), np.array(ends), np.array(values), edges)
    assert out.shape == (edges.size - 1, 1)
    expected = sum(v * (e - s) for s, e, v in zip(starts, ends, values, strict=True))
    assert float(np.sum(out[:, 0] * np.diff(edges))) == pytest.approx(expected, abs=1e-6)
    assert np.all(out >= 0) and np.all(out <= max(values) + 1e-9)


def test_no_finished_jobs_and_no_rounds(tmp_path):
    unfinished = {"gavel": [result("gavel", finished=False)]}
    assert is_png(plots.jct_cdf(unfinished, tmp_path / "jct.png"))
    assert is_png(plots.ftf_cdf(unfinished, tmp_path / "ftf.png"))
    empty = SimResult(workload="w", policy="p", cluster="c", capacity={"a100": 4},
                      jobs=(), rounds=())
    assert is_png(plots.allocation_over_time(empty, tmp_path / "alloc.png"))
    assert is_png(plots.jct_cdf({}, tmp_path / "jct_empty.png"))
    one_round = SimResult(workload="w", policy="p", cluster="c", capacity={},
                          jobs=(), rounds=(RoundRecord(0.0, 0.0, 0, {"v100": 2}),))
    assert is_png(plots.allocation_over_time(one_round, tmp_path / "alloc1.png"))
    no_types = SimResult(workload="w", policy="p", cluster="c", capacity={}, jobs=(),
                         rounds=())
    assert is_png(plots.allocation_over_time(no_types, tmp_path / "alloc0.png"))


def test_write_all_names_and_sanitises(tmp_path):
    runs = {"sia/p=-0.5": [result("sia/p=-0.5", "helios trace #1")],
            "sia p=-0.5": [result("sia p=-0.5", "helios trace #1")],
            "pollux": [],
            "gavel": [result("gavel", "w1", finished=False), result("gavel", "w2")]}
    paths = plots.write_all(runs, tmp_path / "out")
    names = [p.name for p in paths]
    assert names == ["jct_cdf.png", "ftf_cdf.png",
                     "allocation_sia_p_-0.5_helios_trace_1.png",
                     "allocation_sia_p_-0.5_helios_trace_1_2.png",
                     "allocation_gavel_w1.png",
                     "allocation_gavel_w2.png"]
    assert all(p.parent == tmp_path / "out" and is_png(p) for p in paths)


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"sia-grpc\[plots\]"):
        plots.jct_cdf({}, tmp_path / "x.png")


def test_importing_sim_needs_no_matplotlib():
    code = ("import sys, sia_grpc.sim, sia_grpc.sim.metrics, sia_grpc.sim.plots;"
            "sys.exit(1 if 'matplotlib' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------ queues over time


def queued_run(policy="sia", workload="saturn/w1") -> SimResult:
    """Queue q (guarantee 4 a100) holds 6 a100 for 5 rounds (2 borrowed), then is
    owed 4 and holds 1 for 5 rounds (3 short); queue r has no guarantee, a t4 job."""
    from sia_grpc.sim.records import QueueSpec

    recs = []
    for k in range(10):
        held_q = 6 if k < 5 else 1
        recs.append(RoundRecord(k * 60.0, 0.01, 2, {"a100": held_q, "t4": 2},
                                {"b": ("a100", held_q), "c": ("t4", 2)},
                                held={"q": {"a100": held_q, "t4": 0},
                                      "r": {"a100": 0, "t4": 2},
                                      "default": {"a100": 0, "t4": 0}},
                                owed={"q": {"a100": 4.0}, "r": {}, "default": {}}))
    jobs = (JobRecord("b", "bert", "adaptive", 0.0, 0.0, 600.0, 0.0, 0, queue="q"),
            JobRecord("c", "cifar10", "adaptive", 0.0, 0.0, 600.0, 0.0, 0, queue="r"))
    return SimResult(workload=workload, policy=policy, cluster="het-24",
                     capacity=dict(CAPACITY), jobs=jobs, rounds=tuple(recs), round_seconds=60.0,
                     queues={"q": QueueSpec({"a100": 4}), "r": QueueSpec(),
                             "default": QueueSpec()})


def test_queue_figure_shows_held_borrowed_and_short_against_the_guarantee():
    r = queued_run()
    frame = plots.allocation_frame([r])
    panels = plots.queue_panels(r, frame)
    # q: its guaranteed type; r: the type it used; the unused default: nothing.
    assert [p.heading for p in panels] == ["q · a100: guarantee 4 GPUs",
                                          "r · t4: guarantee 0 GPUs"]
    q = panels[0]
    within, borrowed, short = q.layers.values()
    assert list(within) == [4.0] * 5 + [1.0] * 5
    assert list(borrowed) == [2.0] * 5 + [0.0] * 5
    assert list(short) == [0.0] * 5 + [3.0] * 5  # stacked on what it holds: up to 4
    assert q.limit == 4.0 and q.ymax > CAPACITY["a100"]
    fig = plots.queue_figure(r, frame)
    assert len(fig.axes) == 2
    assert np.all(limit_line(fig.axes[0]).get_ydata() == 4.0)
    assert fig.get_suptitle().startswith("GPUs held per queue: sia on saturn/w1")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "held within guarantee", "borrowed (beyond guarantee)", "owed, not held", "guarantee"]


def test_write_all_adds_queue_figures_for_runs_with_queues(tmp_path):
    runs = {"sia": [queued_run()], "gavel": [result("gavel", "w1")]}
    names = [p.name for p in plots.write_all(runs, tmp_path)]
    assert "queues_sia_saturn_w1.png" in names and "queues_gavel_w1.png" not in names
    assert is_png(tmp_path / "queues_sia_saturn_w1.png")
