"""DFRA per compute node (issue 25): with several mounts, a job's forwarding nodes are dealt out
to its compute nodes, one each (pharos_analytics.control.push.compute_node_entry). Pure logic; the
rig test (tests/cluster/test_rig.py) checks it with real mounts and the daemons' records."""

from __future__ import annotations

import pytest

from pharos_analytics.control.push import compute_node_entry


@pytest.mark.parametrize(
    "nodes, job_nodes, cn, fallback, expected",
    [
        (None, ["cn0"], "cn0", 0, None),  # no entry: the mount's default
        (["fwd2"], ["cn0", "cn1"], "cn1", 1, ["fwd2"]),  # one node: every compute node on it
        (["fwd0", "fwd1"], ["cn0", "cn1"], "cn0", 5, ["fwd0"]),
        (["fwd0", "fwd1"], ["cn0", "cn1"], "cn1", 5, ["fwd1"]),
        (["fwd0", "fwd1"], ["cn1", "cn3"], "cn3", 3, ["fwd1"]),  # position in the JOB's nodes, not the site's
        (["fwd0", "fwd1"], ["cn1", "cn3", "cn5"], "cn5", 5, ["fwd0"]),  # dealt round
        (["fwd2", "fwd3"], [], "cn2", 2, ["fwd2"]),  # before the first request: the mount's position
        (["fwd2", "fwd3"], [], "cn3", 3, ["fwd3"]),
        (["fwd0", "fwd1"], ["cn0"], "cn7", 7, ["fwd1"]),  # a node the job has not used yet
    ],
)
def test_compute_node_entry(nodes, job_nodes, cn, fallback, expected):
    assert compute_node_entry(nodes, job_nodes, cn, fallback) == expected
