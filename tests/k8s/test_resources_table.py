"""Every kind of our API has an API path: the client resolves kinds through one table, and
the recording ClusterAPI of the unit tests does not (a kind missing from it failed every
ModelCache reconcile on the real node, and no unit test noticed)."""

from __future__ import annotations

import pytest

from vllm_operator.k8s.resources import resource_for
from vllm_operator.render.crds import all_crds


@pytest.mark.parametrize("crd", all_crds(), ids=lambda c: c["spec"]["names"]["kind"])
def test_every_crd_kind_has_an_api_path(crd: dict[str, object]) -> None:
    spec = crd["spec"]
    assert isinstance(spec, dict)
    api_version = f"{spec['group']}/{spec['versions'][0]['name']}"
    found = resource_for(api_version, spec["names"]["kind"])
    assert found.plural == spec["names"]["plural"]
    assert found.namespaced == (spec["scope"] == "Namespaced")
