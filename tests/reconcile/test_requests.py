"""API requests of one reconcile pass of a converged InferenceService: what the operator
costs the apiserver per service per resync. A regression guard, not a speed claim: it
counts requests against the recording fake of the k8s layer."""

from __future__ import annotations

from tests.reconcile.test_inference_service import NOW, SETTINGS, _cluster, _node, _stored
from vllm_operator.reconcile.inference_service import list_nodes, reconcile_inference_service


async def test_a_converged_pass_makes_eight_requests_and_no_cluster_wide_list() -> None:
    api, body = _cluster(_node("a", 2))
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    body = _stored(api, body)
    view = await list_nodes(api)  # the runtime's caches stand in
    api.calls.clear()
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW, view=view)
    kinds = [(verb, kind) for verb, kind, _ in api.calls]
    assert ("list", "Node") not in kinds and ("list", "GPUNode") not in kinds
    # Lock Jobs, the HPA, three server-side applies (no-ops when converged), the pods,
    # the warmup Jobs and the benchmarks.
    assert len(api.calls) == 8, api.calls
