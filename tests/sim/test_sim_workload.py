"""Job-arrival traces: the shipped ones, and malformed files."""

from pathlib import Path

import pytest

from sia_grpc.models.profiles import APPLICATIONS
from sia_grpc.sim.workload import (
    Category,
    TraceJob,
    WorkloadError,
    load_workload,
    shipped_workloads,
)

HEADER = "name,time,application,num_replicas,batch_size"


def _expected_count(name: str) -> int:
    group = name.rsplit("/", 1)[0]
    if group in ("philly", "saturn"):
        return 160
    if group == "newtrace":
        return 960
    kind, _, value = group.split("/")[1].partition("_")
    if kind == "rate":  # r jobs/hour over 8 hours
        return int(value) * 8
    assert kind == "scale"  # each Helios job k times
    return 160 * int(value.rstrip("x"))


def test_shipped_names():
    names = shipped_workloads()
    assert shipped_workloads("philly") == tuple(f"philly/workload-{k}" for k in (1, 2, 3, 4))
    assert shipped_workloads("saturn") == tuple(f"saturn/workload-{k}" for k in range(1, 6))
    assert shipped_workloads("newtrace") == tuple(
        f"newtrace/workload-{k}" for k in range(1, 6))
    assert set(shipped_workloads("scale")) == {n for n in names if n.startswith("scale/")}
    assert shipped_workloads("scale/rate_30") == (
        "scale/rate_30/workload-1", "scale/rate_30/workload-2")
    assert len(names) == 23
    with pytest.raises(ValueError, match="group"):
        shipped_workloads("helios")


@pytest.mark.parametrize("name", shipped_workloads())
def test_every_shipped_workload_loads(name):
    jobs = load_workload(name)
    assert len(jobs) == _expected_count(name)
    assert len({j.name for j in jobs}) == len(jobs)
    assert list(jobs) == sorted(jobs, key=lambda j: (j.time, j.name))
    for j in jobs:
        assert isinstance(j, TraceJob)
        assert j.application in APPLICATIONS and j.application != "gpt_pmp"
        assert j.time >= 0 and j.num_replicas > 0 and j.batch_size > 0
        assert j.category is Category.ADAPTIVE  # no shipped trace has a category column
        assert j.name.startswith(j.application + "-")


def test_by_name_suffix_and_path_agree():
    by_name = load_workload("philly/workload-1")
    assert load_workload("philly/workload-1.csv") == by_name
    assert by_name[0] == TraceJob("cifar10-0", 107.0, "cifar10", 6, 2048, Category.ADAPTIVE)


def _write(tmp_path: Path, text: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_file_on_disk_with_categories_any_order(tmp_path):
    path = _write(tmp_path, "\n".join([
        "batch_size,category,name,time,application,num_replicas,extra",
        "256,rigid,b,10,cifar10,4,x",
        "",
        "640, Strong-Scaling ,a,10.5,deepspeech2,8,y",
        "128,,c,0,bert,1,z",
        "128,strong,d,3,yolov3,2.0,z",
        "128,adaptive,e,3,imagenet,2,z",
        "128,strong_scaling,f,3,ncf,2,z",
    ]) + "\n")
    jobs = load_workload(path)
    assert [j.name for j in jobs] == ["c", "d", "e", "f", "b", "a"]
    cats = {j.name: j.category for j in jobs}
    assert cats == {"a": Category.STRONG_SCALING, "b": Category.RIGID,
                    "c": Category.ADAPTIVE, "d": Category.STRONG_SCALING,
                    "e": Category.ADAPTIVE, "f": Category.STRONG_SCALING}
    assert jobs[-1] == TraceJob("a", 10.5, "deepspeech2", 8, 640, Category.STRONG_SCALING)
    assert load_workload(str(path)) == jobs


@pytest.mark.parametrize(("lines", "match"), [
    ([HEADER, "a,1,cifar10,1,128", "b,x,cifar10,1,128"],
     r"line 3: time: not a number: 'x'"),
    ([HEADER, "a,-1,cifar10,1,128"], r"line 2: time: must be non-negative"),
    ([HEADER, "a,inf,cifar10,1,128"], r"line 2: time: not a finite number"),
    ([HEADER, "a,1,cifar10,0,128"], r"line 2: num_replicas: must be positive"),
    ([HEADER, "a,1,cifar10,2,12.5"], r"line 2: batch_size: not an integer: '12.5'"),
    ([HEADER, "a,1,cifar10,2,"], r"line 2: batch_size: not a number: ''"),
    ([HEADER, "a,1,resnet,1,128"], r"line 2: application: unknown 'resnet'"),
    ([HEADER, "a,1,cifar10,1,128", "", "a,2,bert,1,12"],
     r"line 4: name: duplicate 'a' \(first on line 2\)"),
    ([HEADER, ",1,cifar10,1,128"], r"line 2: name: empty"),
    ([HEADER, "a,1,cifar10,1"], r"line 2: expected 5 fields, got 4"),
    ([HEADER + ",category", "a,1,cifar10,1,128,elastic"],
     r"line 2: category: unknown 'elastic'"),
    (["name,time,application,batch_size", "a,1,cifar10,128"],
     r"line 1: header: missing column\(s\) 'num_replicas'"),
    ([HEADER + ",time", "a,1,cifar10,1,128,2"], r"line 1: header: duplicate column 'time'"),
    ([HEADER], r"no jobs"),
    ([""], r"empty file"),
])
def test_malformed_csv_names_file_line_and_field(tmp_path, lines, match):
    path = _write(tmp_path, "\n".join(lines) + "\n", "bad.csv")
    with pytest.raises(WorkloadError, match=match) as info:
        load_workload(path)
    assert str(info.value).startswith(str(path))
    assert isinstance(info.value, ValueError)


def test_missing_workload():
    with pytest.raises(WorkloadError, match="no such file or shipped workload"):
        load_workload("philly/workload-99")
    with pytest.raises(WorkloadError, match="no such file"):
        load_workload("../artifact/workloads/philly/workload-1")
