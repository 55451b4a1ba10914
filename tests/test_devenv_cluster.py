"""The local cluster's choice of the fake pods' addresses (devenv/cluster), without a cluster."""

from __future__ import annotations

import ipaddress

import pytest

from devenv.cluster import node as real_node
from devenv.cluster.cluster import pod_network
from devenv.cluster.processes import ClusterError
from devenv.cluster.settings import FAKE_POD_CIDRS, LOOPBACK_POD_CIDRS


def test_the_default_ranges_are_taken_and_loopback_needs_no_route() -> None:
    first, second = (pod_network(c) for c in FAKE_POD_CIDRS)
    assert first is not None and second is not None and not first.overlaps(second)
    for net in (first, second):
        assert net.subnet_of(ipaddress.IPv4Network(real_node.TEST_NET))
    assert [pod_network(c) for c in LOOPBACK_POD_CIDRS] == [None, None]


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
