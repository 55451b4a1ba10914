"""PodClient, the operator's one client of its own pods: every failure of a request
becomes a PodHTTPError whose words are the ones the reconciles reported when they called
httpx themselves (a connect error, a timeout, an HTTP error status)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from vllm_operator.servers.adapters import NO_ADAPTER_API, AdapterApiError
from vllm_operator.servers.pods import METRICS_TIMEOUT_SECONDS, PodClient, PodHTTPError

METRICS_URL = "http://10.0.0.7:8000/metrics"
ENDPOINT = "http://10.0.0.7:8000"

Handler = Callable[[httpx.Request], httpx.Response]


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _time_out(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def _unavailable(request: httpx.Request) -> httpx.Response:
    return httpx.Response(503, text="starting")


def _no_route(request: httpx.Request) -> httpx.Response:
    return httpx.Response(404, json={"detail": "Not Found"})  # FastAPI: no such route


FAILURES = [
    pytest.param(_refuse, None, id="a refused connection has no status"),
    pytest.param(_time_out, None, id="a timeout has no status"),
    pytest.param(_unavailable, 503, id="an error status keeps its code"),
]


async def _scraped_before(handler: Handler) -> str:
    """The words the autoscaler logged before PodClient: reconcile/autoscale.py's
    http_scraper, a GET and raise_for_status on the bare httpx client, and str() of what
    it raised."""
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        try:
            response = await http.get(METRICS_URL, timeout=3.0)
            response.raise_for_status()
        except httpx.HTTPError as err:
            return str(err)
    raise AssertionError("the request did not fail")


@pytest.mark.parametrize(("handler", "status"), FAILURES)
async def test_a_failed_metrics_read_is_a_pod_error_in_the_words_of_before(
    handler: Handler, status: int | None
) -> None:
    client = PodClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(PodHTTPError) as raised:
        await client.metrics(METRICS_URL)
    await client.aclose()
    assert str(raised.value) == await _scraped_before(handler)
    assert raised.value.status == status
    assert not isinstance(raised.value, httpx.HTTPError)


async def test_metrics_are_read_with_the_autoscalers_timeout() -> None:
    seen: list[httpx.Request] = []

    def serve(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="vllm:num_requests_running 1\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as http:
        assert await PodClient(http).metrics(METRICS_URL) == "vllm:num_requests_running 1\n"
    [request] = seen
    assert (request.method, str(request.url)) == ("GET", METRICS_URL)
    assert METRICS_TIMEOUT_SECONDS == 3.0
    assert request.extensions["timeout"] == {
        "connect": 3.0, "read": 3.0, "write": 3.0, "pool": 3.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("handler", "words", "status"),
    [
        pytest.param(
            _refuse,
            f"{ENDPOINT}/v1/models: ConnectError: connection refused",
            None,
            id="a refused connection names the URL and the error",
        ),
        pytest.param(
            _time_out,
            f"{ENDPOINT}/v1/models: ReadTimeout: timed out",
            None,
            id="a timeout names the URL and the error",
        ),
    ],
)
async def test_a_failed_adapter_listing_is_a_pod_error_in_the_words_of_before(
    handler: Handler, words: str, status: int | None
) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        with pytest.raises(PodHTTPError) as raised:
            await PodClient(http).loaded_adapters(ENDPOINT)
    assert isinstance(raised.value, AdapterApiError)
    assert (str(raised.value), raised.value.status) == (words, status)


async def test_an_adapter_refused_with_a_status_is_a_pod_error_with_the_servers_meaning() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_no_route)) as http:
        with pytest.raises(PodHTTPError) as raised:
            await PodClient(http).load_adapter(ENDPOINT, "sql", "/opt/a/sql")
    assert (str(raised.value), raised.value.status) == (NO_ADAPTER_API, 404)


@pytest.mark.parametrize("handler", [_refuse, _time_out, _unavailable])
async def test_a_download_job_that_does_not_answer_has_no_progress(handler: Handler) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        assert await PodClient(http).download_progress("10.0.0.9", 8090) is None
