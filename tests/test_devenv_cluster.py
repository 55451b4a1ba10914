"""The local cluster's choice of the fake pods' addresses (devenv/cluster), without a cluster."""

from __future__ import annotations

import ipaddress

import pytest
from e2e import chart_fixtures

from devenv.cluster import node as real_node
from devenv.cluster.cluster import pod_network
from devenv.cluster.processes import ClusterError
from devenv.cluster.settings import (
    FAKE_POD_CIDRS,
    LOOPBACK_POD_CIDRS,
    SIDE,
    Settings,
    default_pod_cidr,
)


def test_the_default_ranges_are_taken_apart_and_loopback_needs_no_route() -> None:
    nets = [pod_network(c) for c in FAKE_POD_CIDRS]
    assert len(nets) == 3  # the shared cluster's, a private one's, the side cluster's
    for i, net in enumerate(nets):
        assert net is not None and net.subnet_of(ipaddress.IPv4Network(real_node.TEST_NET))
        assert not any(net.overlaps(other) for other in nets[i + 1 :] if other), (net, nets)
    assert [pod_network(c) for c in LOOPBACK_POD_CIDRS] == [None, None, None]


@pytest.mark.parametrize(
    ("cidr", "words"),
    [
        ("10.0.0.0/16", "must lie in 127.0.0.0/8 or in 198.18.0.0/15"),
        ("192.168.7.0/24", "must lie in 127.0.0.0/8"),
        (real_node.POD_CIDR, real_node.POD_CIDR),
        ("198.18.128.0/24", real_node.SERVICE_CIDR),
        ("198.18.0.0/15", "apart from the real node's"),
        ("198.19.0.0/33", "is not an IPv4 range"),
        ("fd00::/64", "is not an IPv4 range"),
    ],
)
def test_a_range_that_could_be_someone_elses_is_refused_naming_the_setting(
    cidr: str, words: str
) -> None:
    with pytest.raises(ClusterError, match="VLLM_OP_POD_CIDR") as err:
        pod_network(cidr)
    assert words in str(err.value)


PORT_VARS = (
    "VLLM_OP_ETCD_PORT",
    "VLLM_OP_ETCD_PEER_PORT",
    "VLLM_OP_APISERVER_PORT",
    "VLLM_OP_CONTROLLER_MANAGER_PORT",
    "VLLM_OP_SCHEDULER_PORT",
    "VLLM_OP_KWOK_PORT",
)


def _ports(s: Settings) -> set[int]:
    return {
        s.etcd_port,
        s.etcd_peer_port,
        s.apiserver_port,
        s.controller_manager_port,
        s.scheduler_port,
        s.kwok_port,
    }


def test_the_side_cluster_takes_its_own_ports_folder_and_range_and_no_real_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (*PORT_VARS, "VLLM_OP_CLUSTER_DIR", "VLLM_OP_POD_CIDR", "VLLM_OP_REAL_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("VLLM_OP_CLUSTER_SLOT", raising=False)
    shared = Settings.from_env()
    monkeypatch.setenv("VLLM_OP_CLUSTER_SLOT", "1")
    side = Settings.from_env()
    assert shared.real_node and not side.real_node
    assert side.state_dir == shared.state_dir.with_name(".cluster-1")
    assert side.pod_cidr == default_pod_cidr(SIDE) != shared.pod_cidr
    # No port of the side cluster, nor of a private control plane beside either cluster
    # (e2e/chart_fixtures.py: +5000), is another's; all stay out of the ephemeral range.
    with monkeypatch.context() as m:
        m.delenv("VLLM_OP_CLUSTER_SLOT")
        shared_private = _ports(chart_fixtures.private_settings(shared.state_dir))
    side_private = _ports(chart_fixtures.private_settings(side.state_dir))
    groups = [_ports(shared), shared_private, _ports(side), side_private]
    assert sum(len(g) for g in groups) == len(set().union(*groups)) == 24
    assert max(set().union(*groups)) < 32768


def test_a_slot_other_than_the_two_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_OP_CLUSTER_SLOT", "2")
    with pytest.raises(ClusterError, match="VLLM_OP_CLUSTER_SLOT 2 is not 0"):
        Settings.from_env()
