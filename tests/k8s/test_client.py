"""The real client's own behaviour, against local sockets: a request on a connection that
never answers fails as transient within its timeout instead of waiting for ever, and the
discovery read that the start checks the CRDs with."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from vllm_operator.k8s.api import ApiError
from vllm_operator.k8s.client import KubeClient, request_timeout

DEADLINE_S = 20  # ends a hung run (the bug); the request's own timeout is 0.3 s


async def _serve(answer: bytes | None) -> tuple[asyncio.Server, int]:
    """A server on 127.0.0.1 that sends ``answer`` to every request, or, for None, reads
    the request and never answers (a silent, open connection)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer is None:
            await asyncio.Event().wait()
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def silent() -> AsyncIterator[int]:
    server, port = await _serve(None)
    yield port
    server.close()


def _kube(port: int, timeout: float) -> KubeClient:
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    return KubeClient(client.ApiClient(configuration=configuration), timeout=timeout)


def _http(status: int, body: object) -> bytes:
    text = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + text


async def test_a_silent_connection_fails_the_request_as_transient(silent: int) -> None:
    """Before, kubernetes_asyncio's empty ClientTimeout() waited for ever: this hung."""
    kube = _kube(silent, timeout=0.3)
    try:
        with pytest.raises(ApiError) as caught:
            await asyncio.wait_for(kube.get("v1", "ConfigMap", "c", "ns"), DEADLINE_S)
    finally:
        await kube.close()
    assert caught.value.status == 0 and caught.value.transient


@pytest.mark.parametrize("seconds", [0.5, 30.0], ids=["below the connect bound", "the default"])
def test_connecting_takes_at_most_the_whole_request_time(seconds: float) -> None:
    timeout = request_timeout(seconds)
    assert timeout.total == seconds
    assert timeout.sock_connect is not None and 0 < timeout.sock_connect <= seconds


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, {"kind": "APIResourceList", "resources": [{"name": "inferenceservices"},
                                                        {"name": "inferenceservices/status"}]},
         {"inferenceservices", "inferenceservices/status"}),
        (404, {"kind": "Status", "reason": "NotFound", "code": 404}, set()),
    ],
    ids=["a served group version lists its resources", "an unserved one (no CRDs) has none"],
)  # fmt: skip
async def test_served_resources(status: int, body: object, expected: set[str]) -> None:
    server, port = await _serve(_http(status, body))
    kube = _kube(port, timeout=DEADLINE_S)
    try:
        assert await kube.served("inference.vllm-operator.dev/v1alpha1") == expected
    finally:
        await kube.close()
        server.close()


async def test_the_request_metric_names_a_list_list_and_a_get_get() -> None:
    from vllm_operator.metrics import API_REQUESTS

    def count(verb: str) -> float:
        return API_REQUESTS.labels(verb, "pods")._value.get()

    server, port = await _serve(_http(200, {"kind": "PodList", "items": []}))
    kube = _kube(port, timeout=DEADLINE_S)
    lists, gets = count("LIST"), count("GET")
    try:
        await kube.list("v1", "Pod", "team")
    finally:
        await kube.close()
        server.close()
    assert (count("LIST") - lists, count("GET") - gets) == (1, 0)


async def test_a_refusal_carries_the_reasons_of_its_causes() -> None:
    status = {
        "kind": "Status", "code": 403, "reason": "Forbidden",
        "message": 'services "chat" is forbidden: namespace team is being terminated',
        "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
    }  # fmt: skip
    server, port = await _serve(_http(403, status))
    kube = _kube(port, timeout=DEADLINE_S)
    try:
        with pytest.raises(ApiError) as caught:
            await kube.get("v1", "Service", "chat", "team")
    finally:
        await kube.close()
        server.close()
    assert caught.value.namespace_terminating and not caught.value.transient


async def test_an_event_the_apiserver_refused_while_busy_is_posted_again() -> None:
    """CI of d499962: the autoscaler scaled up and no ScaledUp event was on record."""
    answers = [
        _http(503, {"kind": "Status", "code": 503, "reason": "ServiceUnavailable"}),
        _http(429, {"kind": "Status", "code": 429, "reason": "TooManyRequests"}),
        _http(201, {"kind": "Event", "metadata": {"name": "auto.1"}}),
    ]
    posted: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )  # fmt: skip
        posted.append(await reader.readexactly(length))
        writer.write(answers.pop(0))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    kube = _kube(server.sockets[0].getsockname()[1], timeout=DEADLINE_S)
    involved = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "auto", "namespace": "t"}}
    try:
        await asyncio.wait_for(kube.event(involved, reason="ScaledUp", message="m"), DEADLINE_S)
    finally:
        await kube.close()
        server.close()
    assert answers == [] and len(posted) == 3
    assert {json.loads(body)["reason"] for body in posted} == {"ScaledUp"}
