"""Clusters from TOML files and by built-in name."""

from importlib import resources

import pytest

from sia_grpc.policy.cluster import Cluster, paper_hetero_cluster, paper_homo_cluster
from sia_grpc.sim.clusters import (
    BUILTIN_CLUSTERS,
    ClusterConfigError,
    ClusterSpec,
    GpuTypeSpec,
    load_cluster,
    parse_cluster_toml,
    read_cluster_spec,
)

GOOD = """\
name = "small"

[[gpu_types]]
name = "rtx"
nodes = 2
gpus_per_node = 8

[[gpu_types]]
name = "quad"
nodes = 1
gpus_per_node = 4
"""


def _shipped(name):
    return resources.files("sia_grpc").joinpath("data", "clusters", f"{name}.toml")


@pytest.mark.parametrize("scale", [1, 2, 5])
def test_builtins_are_the_paper_clusters(scale):
    assert load_cluster("hetero64", scale) == paper_hetero_cluster(scale)
    assert load_cluster("homo64", scale=scale) == paper_homo_cluster(scale)
    assert load_cluster("hetero64").total_gpus == load_cluster("homo64").total_gpus == 64
    assert load_cluster("hetero64", scale).capacity == {
        "aws": 24 * scale, "rtx": 24 * scale, "dgx-ext": 16 * scale}


@pytest.mark.parametrize("name", sorted(BUILTIN_CLUSTERS))
@pytest.mark.parametrize("scale", [1, 3])
def test_shipped_files_equal_the_builtins(name, scale):
    path = _shipped(name)
    assert path.is_file()
    spec = read_cluster_spec(str(path))
    assert spec.name == name
    assert spec.build(scale) == load_cluster(name, scale)
    assert load_cluster(str(path), scale) == BUILTIN_CLUSTERS[name](scale)
    assert read_cluster_spec(name) == spec  # shipped file by name


def test_file_on_disk(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(GOOD, encoding="utf-8")
    spec = read_cluster_spec(path)
    assert spec == ClusterSpec("small", (GpuTypeSpec("rtx", 2, 8), GpuTypeSpec("quad", 1, 4)))
    cluster = load_cluster(path, scale=2)
    assert isinstance(cluster, Cluster)
    assert cluster == Cluster.uniform({"rtx": (4, 8), "quad": (2, 4)})
    assert [n.name for n in cluster.nodes if n.gpu_type == "rtx"] == [
        "rtx-0", "rtx-1", "rtx-2", "rtx-3"]


def test_odd_node_sizes_become_virtual_nodes():
    spec = parse_cluster_toml('name = "odd"\n[[gpu_types]]\nname = "aws"\nnodes = 2\n'
                              'gpus_per_node = 6\n')
    assert spec.build().gpus_per_vnode == {"aws": 2}


@pytest.mark.parametrize(("text", "match"), [
    ('name = "x"\n', r"gpu_types: missing"),
    ('[[gpu_types]]\nname = "aws"\nnodes = 1\ngpus_per_node = 4\n', r": name: missing"),
    ('name = "x"\nnodes = 3\n[[gpu_types]]\nname = "aws"\nnodes = 1\ngpus_per_node = 4\n',
     r": nodes: unknown key"),
    ('name = "x"\n[[gpu_types]]\nname = "aws"\ngpus_per_node = 4\n',
     r"gpu_types\[0\]\.nodes: missing"),
    ('name = "x"\n[[gpu_types]]\nname = "aws"\nnodes = 0\ngpus_per_node = 4\n',
     r"gpu_types\[0\]\.nodes: must be a positive integer, got 0"),
    ('name = "x"\n[[gpu_types]]\nname = "aws"\nnodes = 1\ngpus_per_node = -4\n',
     r"gpu_types\[0\]\.gpus_per_node: must be a positive integer, got -4"),
    ('name = "x"\n[[gpu_types]]\nname = "aws"\nnodes = 1.5\ngpus_per_node = 4\n',
     r"gpu_types\[0\]\.nodes: must be a positive integer"),
    ('name = "x"\n[[gpu_types]]\nname = "aws"\nnodes = true\ngpus_per_node = 4\n',
     r"gpu_types\[0\]\.nodes: must be a positive integer"),
    ('name = "x"\n[[gpu_types]]\nname = "aws"\nnodes = 1\ngpus_per_node = 4\ngpus = 4\n',
     r"gpu_types\[0\]\.gpus: unknown key"),
    ('name = "x"\n[[gpu_types]]\nname = "aws"\nnodes = 1\ngpus_per_node = 4\n'
     '[[gpu_types]]\nname = "aws"\nnodes = 2\ngpus_per_node = 4\n',
     r"gpu_types\[1\]\.name: duplicate GPU type 'aws'"),
    ('name = "x"\n[[gpu_types]]\nname = 4\nnodes = 1\ngpus_per_node = 4\n',
     r"gpu_types\[0\]\.name: must be a non-empty string"),
    ('name = "x"\n[[gpu_types]]\nname = "a b"\nnodes = 1\ngpus_per_node = 4\n',
     r"gpu_types: .*not a valid"),
    ('name = ""\n[[gpu_types]]\nname = "aws"\nnodes = 1\ngpus_per_node = 4\n',
     r": name: must be a non-empty string"),
    ('name = "x"\ngpu_types = []\n', r"gpu_types: must be a non-empty array of tables"),
    ('name = "x"\ngpu_types = [1, 2]\n', r"gpu_types: must be a non-empty array of tables"),
    ('name = "x"\n[gpu_types]\nname = "aws"\n', r"gpu_types: must be a non-empty array"),
    ('name = "x\n', r"invalid TOML"),
    ('name = "x"\n[[gpu_types]\n', r"invalid TOML"),
])
def test_bad_files_name_the_field(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ClusterConfigError, match=match) as info:
        load_cluster(path)
    assert str(info.value).startswith(str(path))
    assert isinstance(info.value, ValueError)


def test_unknown_cluster_and_bad_scale(tmp_path):
    with pytest.raises(ClusterConfigError, match="no such cluster file or built-in"):
        load_cluster("hetero128")
    with pytest.raises(ClusterConfigError, match="no such cluster file"):
        load_cluster(tmp_path / "missing.toml")
    for scale in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="scale"):
            load_cluster("hetero64", scale)
    with pytest.raises(ValueError, match="scale"):
        read_cluster_spec("homo64").build(0)
