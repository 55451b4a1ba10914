"""What the load generator records about each request, and about one load level.

A record keeps raw instants, not durations, all on one monotonic clock (seconds): when the
request was *scheduled* to go out, when it was actually *sent* (its body handed to the
socket), when each content chunk
arrived, when the response ended. Every latency the benchmark reports is a difference of
two of these, computed afterwards by the pure ``stats`` module, so the same recording can
be summarised from the send time and from the scheduled time, and re-summarised later
from the JSON file.

Token counts come only from the server's final usage chunk (``stream_options.include_usage``):
a chunk may carry several tokens, so counting chunks under-counts tokens and over-states
time per output token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

# Error kinds (the keys of errors_by_kind). Deadline misses are failures, not slow
# successes: the client gives up on the request when its deadline passes.
TTFT_DEADLINE: Final = "TTFTDeadlineMissed"
TPOT_DEADLINE: Final = "TPOTDeadlineMissed"
E2E_DEADLINE: Final = "E2EDeadlineMissed"
DEADLINE_KINDS: Final = frozenset({TTFT_DEADLINE, TPOT_DEADLINE, E2E_DEADLINE})
TIMEOUT: Final = "Timeout"  # the request timeout (no SLO), not a deadline
CONNECT_ERROR: Final = "ConnectError"
CONNECTION_LOST: Final = "ConnectionLost"
STREAM_ERROR: Final = "StreamError"  # the server sent an error event mid-stream
PROTOCOL_ERROR: Final = "ProtocolError"  # unparseable stream
NO_USAGE: Final = "NoUsage"  # the stream ended without a usage chunk
UNFINISHED: Final = "Unfinished"  # still running when the level's drain time ran out
CLIENT_ERROR: Final = "ClientError"  # anything else raised by the client


def http_error(status: int) -> str:
    """Error kind of an HTTP status other than 200 (HTTP429, HTTP503, ...)."""
    return f"HTTP{status}"


@dataclass(slots=True)
class RequestRecord:
    """One request: what was planned, and the instants at which things happened."""

    index: int
    scheduled: float
    prompt_tokens_planned: int
    output_tokens_planned: int
    sent: float | None = None
    first_token: float | None = None
    # Arrival instant of every chunk that carried generated content (the first included).
    chunk_times: list[float] = field(default_factory=list)
    end: float | None = None
    status: int | None = None
    # From the server's usage; None when it sent none.
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    def to_json(self, origin: float) -> dict[str, Any]:
        """JSON form with instants as seconds after ``origin`` (the level's start)."""

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - origin, 9)

        return {
            "index": self.index,
            "scheduled": rel(self.scheduled),
            "sent": rel(self.sent),
            "first_token": rel(self.first_token),
            "end": rel(self.end),
            "chunk_times": [round(t - origin, 9) for t in self.chunk_times],
            "status": self.status,
            "prompt_tokens_planned": self.prompt_tokens_planned,
            "output_tokens_planned": self.output_tokens_planned,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "error": self.error,
            "error_detail": self.error_detail,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        """Inverse of :meth:`to_json` (instants relative to the level's start)."""

        return cls(
            index=int(data["index"]),
            scheduled=float(data["scheduled"]),
            prompt_tokens_planned=int(data["prompt_tokens_planned"]),
            output_tokens_planned=int(data["output_tokens_planned"]),
            sent=data.get("sent"),
            first_token=data.get("first_token"),
            chunk_times=[float(t) for t in data.get("chunk_times", [])],
            end=data.get("end"),
            status=data.get("status"),
            prompt_tokens=data.get("prompt_tokens"),
            completion_tokens=data.get("completion_tokens"),
            error=data.get("error"),
            error_detail=data.get("error_detail"),
        )


@dataclass(frozen=True, slots=True)
class Load:
    """The offered load of one level: an open-loop rate or a closed-loop concurrency."""

    rate_per_second: float | None = None
    concurrency: int | None = None
    # The arrival process, for reports ("Poisson", "Gamma", ...).
    process: str = "Poisson"

    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        if self.rate_per_second is not None:
            return f"{self.rate_per_second:g} req/s"
        return self.process


@dataclass(frozen=True, slots=True)
class LevelRecording:
    """Everything the client observed while running one load level."""

    load: Load
    records: tuple[RequestRecord, ...]
    # Monotonic instants: the level's time origin (first scheduled send) and when the last
    # request finished or was given up.
    start: float
    end: float
    # Wall-clock time (Unix seconds) at ``start``, for reports.
    wall_start: float
    # The client process's CPU seconds (user + system) over the level; with the level's
    # duration it says how busy the client was.
    client_cpu_seconds: float | None = None
    # Cap on requests in flight in the client (None: none); a capped open-loop client
    # queues requests and shows it as schedule lag.
    max_in_flight: int | None = None
    # Connections: opened during the level, the most open (or opening) at once, the cap
    # on them, and how many due requests found the pool at that cap (they waited for a
    # connection to come free). None: not recorded (results of older versions).
    connections_opened: int | None = None
    connections_peak: int | None = None
    max_connections: int | None = None
    requests_at_connection_cap: int | None = None
