"""The vertex_job recipe's replicas find their place from CLUSTER_SPEC, as Vertex sets it, and a
multi-node job without one stops instead of training alone on every node."""

from __future__ import annotations

import json
import os
import subprocess

import pytest


@pytest.fixture(scope="module", autouse=True)
def _aiplatform():
    """labkit.recipes.vertex_job (it imports the Vertex AI client), imported when this module's
    first test runs rather than at collection."""
    global vertex_job
    vertex_job = pytest.importorskip("labkit.recipes.vertex_job")


SPEC = {"cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
                    "workerpool1": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"],
                    "workerpool2": ["cmle-training-workerpool2-ab-0:2222"]},
        "environment": "cloud", "task": {"type": "workerpool1", "index": 1}}


def place(nodes: int, spec: dict | None) -> subprocess.CompletedProcess:
    """The recipe's bash prelude as a replica runs it, printing what torchrun would be given."""
    env = {k: v for k, v in os.environ.items() if k != "CLUSTER_SPEC"}
    if spec is not None:
        env["CLUSTER_SPEC"] = json.dumps(spec)
    script = (f"set -e; cluster=$(python -c '{vertex_job.CLUSTER_PY}' {nodes}); eval \"$cluster\"; "
              "echo $NNODES $NODE_RANK $MASTER_HOST $MASTER_PORT")
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_each_node_takes_its_rank_and_the_primary_address():
    assert place(3, SPEC).stdout.split() == ["3", "2", "cmle-training-workerpool0-ab-0", "2222"]
    primary = {**SPEC, "task": {"type": "workerpool0", "index": 0}}
    assert place(3, primary).stdout.split()[:2] == ["3", "0"]


def test_one_node_runs_without_a_cluster_description():
    assert place(1, None).stdout.split() == ["1", "0", "localhost", "29500"]


@pytest.mark.parametrize(("nodes", "spec", "said"), [(2, None, "CLUSTER_SPEC is not set"),
                                                    (2, SPEC, "lists 3 training node(s)")])
def test_a_multi_node_job_that_cannot_find_its_nodes_stops(nodes, spec, said):
    done = place(nodes, spec)
    assert done.returncode != 0 and said in done.stderr and done.stdout == ""
