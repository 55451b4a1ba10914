"""The chaos phase's noisy neighbour (bench/neighbour.py): its orders and state on a board
(in memory here; the results ConfigMap in e2e/test_benchmark.py), every way its burn
stops, and its place in a run."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from collections.abc import Mapping
from typing import Any

import pytest

from devenv.fakes.openai_server import Config, Delay
from tests.bench.conftest import ServerFactory
from vllm_operator.bench import neighbour, timing
from vllm_operator.bench.neighbour import (
    ORDER_KEY,
    STATE_KEY,
    NeighbourState,
    ProcessBurner,
    cpus_to_burn,
    order,
    run_neighbour,
    start_burn,
)
from vllm_operator.bench.run import BenchmarkError, RunOptions, run_benchmark
from vllm_operator.cli import main as cli_main
from vllm_operator.models.inference_benchmark import InferenceBenchmarkSpec


class MemoryBoard:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.failing = False

    async def read(self) -> Mapping[str, str]:
        if self.failing:
            raise OSError("the API is down")
        return dict(self.data)

    async def write(self, values: Mapping[str, str]) -> None:
        if self.failing:
            raise OSError("the API is down")
        self.data.update(values)

    def state(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.data[STATE_KEY])
        return value


class FakeBurner:
    def __init__(self) -> None:
        self.burning: int | None = None
        self.starts = 0

    def start(self, cpus: int) -> None:
        self.burning = cpus
        self.starts += 1

    def stop(self) -> None:
        self.burning = None


async def _until(check: Any, within: float = 5.0) -> None:
    end = time.monotonic() + within
    while not check():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


def test_the_share_of_cpus_is_at_least_one_and_at_most_all() -> None:
    assert cpus_to_burn(0.3, 8) == 2
    assert cpus_to_burn(0.3, 2) == 1
    assert cpus_to_burn(0.01, 64) == 1
    assert cpus_to_burn(1.0, 16) == 16


async def test_the_neighbour_burns_only_while_ordered_and_leaves_when_done() -> None:
    board, burner = MemoryBoard(), FakeBurner()
    task = asyncio.create_task(
        run_neighbour(
            board, cpu_share=0.5, node="n1", deadline_s=30, burner=burner, node_cpus=4,
            poll_s=0.01,
        )
    )  # fmt: skip
    await _until(lambda: STATE_KEY in board.data)
    assert board.state()["burning"] is False and burner.burning is None
    await order(board, burn=True, until=time.time() + 30)
    await _until(lambda: burner.burning == 2)
    await _until(lambda: board.state()["burning"] is True)
    assert board.state()["node"] == "n1" and board.state()["cpus"] == 2
    await order(board, burn=False)
    await _until(lambda: burner.burning is None)
    await order(board, burn=False, done=True)
    assert await asyncio.wait_for(task, 5) == "done"


async def test_an_order_past_its_time_stops_the_burn() -> None:
    board, burner = MemoryBoard(), FakeBurner()
    await order(board, burn=True, until=time.time() + 0.3)
    task = asyncio.create_task(
        run_neighbour(board, cpu_share=1, node="n", deadline_s=30, burner=burner, node_cpus=1,
                      poll_s=0.01)
    )  # fmt: skip
    await _until(lambda: burner.burning == 1)
    # The load Job died: nobody says stop, and the order's time runs out.
    await _until(lambda: burner.burning is None, within=3)
    await order(board, burn=False, done=True)
    await asyncio.wait_for(task, 5)


async def test_a_board_it_cannot_read_stops_the_burn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(neighbour, "STALE_S", 0.2)
    board, burner = MemoryBoard(), FakeBurner()
    await order(board, burn=True, until=time.time() + 60)
    task = asyncio.create_task(
        run_neighbour(board, cpu_share=1, node="n", deadline_s=30, burner=burner, node_cpus=1,
                      poll_s=0.01)
    )  # fmt: skip
    await _until(lambda: burner.burning == 1)
    board.failing = True
    await _until(lambda: burner.burning is None, within=3)
    board.failing = False
    await order(board, burn=False, done=True)
    await asyncio.wait_for(task, 5)


async def test_the_deadline_ends_the_neighbour_and_its_burn() -> None:
    board, burner = MemoryBoard(), FakeBurner()
    await order(board, burn=True, until=time.time() + 60)
    why = await run_neighbour(
        board, cpu_share=1, node="n", deadline_s=0.3, burner=burner, node_cpus=1, poll_s=0.01
    )
    assert why == "deadline"
    assert burner.starts == 1 and burner.burning is None
    assert board.state()["burning"] is False


async def test_the_load_job_waits_for_the_burn_and_says_when_it_never_came() -> None:
    board = MemoryBoard()
    assert await start_burn(board, seconds=10, wait_s=0.1, poll_s=0.01) == (
        "the neighbour did not start burning within 0.1 s (see its Job's pod)"
    )
    assert json.loads(board.data[ORDER_KEY])["burn"] is True
    board.data[STATE_KEY] = json.dumps({"node": "n2", "cpus": 3, "burning": True})
    assert await start_burn(board, seconds=10, wait_s=1, poll_s=0.01) == NeighbourState(
        "n2", 3, True
    )


@pytest.mark.parametrize(
    ("state", "words"),
    [
        (
            {"node": "n", "cpus": 2, "allowed": [0], "nodeCpus": 4, "beside": "svc-a",
             "besideQos": "Guaranteed"},
            "noisy neighbour: 2 CPUs burnt on node n beside pod svc-a (Guaranteed QoS), "
            "on CPUs 0 only (1-3 held for pinned containers)",
        ),
        (
            {"node": "n", "cpus": 1, "allowed": [0, 1, 2, 5], "nodeCpus": 6},
            "noisy neighbour: 1 CPU burnt on node n, on CPUs 0-2,5 only (3-4 held for pinned "
            "containers)",
        ),
        (
            {"node": "n", "cpus": 2, "allowed": [0, 1], "nodeCpus": 2, "beside": "svc-a"},
            "noisy neighbour: 2 CPUs burnt on node n beside pod svc-a, on all CPUs (0-1)",
        ),
        # A neighbour of an older image reports no CPUs and no pod.
        ({"node": "n", "cpus": 3, "burning": True}, "noisy neighbour: 3 CPUs burnt on node n"),
    ],
    ids=[
        "a pinned pod's CPUs are named as held from the neighbour",
        "the CPU lists are the kernel's ranges",
        "an unpinned pod shares every CPU with the neighbour",
        "a state without CPUs or pod says what it knows",
    ],
)  # fmt: skip
def test_the_perturbation_says_beside_which_pod_and_on_which_cpus_the_neighbour_burnt(
    state: dict[str, Any], words: str
) -> None:
    assert NeighbourState.of(state).describe() == words


def test_the_neighbour_reports_the_cpus_its_cpuset_allows_and_the_pod_it_is_beside() -> None:
    board, burner = MemoryBoard(), FakeBurner()
    board.data[ORDER_KEY] = json.dumps({"done": True})
    why = timing.run(
        run_neighbour(board, cpu_share=1, node="n", deadline_s=5, burner=burner, node_cpus=2,
                      beside="svc-a", beside_qos="Guaranteed", poll_s=0.01)
    )  # fmt: skip
    assert why == "done"
    state = json.loads(board.data[STATE_KEY])
    # Unless told, the CPUs this process may run on.
    assert state["allowed"] == sorted(os.sched_getaffinity(0))
    assert (state["nodeCpus"], state["beside"], state["besideQos"]) == (2, "svc-a", "Guaranteed")


def test_the_process_burner_really_burns_a_cpu() -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    burner = ProcessBurner()
    burner.start(1)
    time.sleep(1.5)
    burner.stop()
    burnt = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before
    # A busy process on a shared two-core machine: well above an idle one's nothing.
    assert burnt > 0.2, burnt


def _spec(**chaos: Any) -> InferenceBenchmarkSpec:
    return InferenceBenchmarkSpec.model_validate(
        {
            "targetRef": {"name": "svc"},
            "workload": {
                "promptTokens": {"type": "Fixed", "value": 8},
                "outputTokens": {"type": "Fixed", "value": 3},
            },
            "arrival": {"process": "Constant", "ratePerSecond": 20},
            "requests": 10,
            "chaos": {"ratePerSecond": 20, **chaos},
        }
    )


def test_a_run_orders_the_neighbour_for_its_perturbed_part_only_then_dismisses_it(
    fake_server: ServerFactory,
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.01), itl=Delay(value=0.005)))
    board, burner = MemoryBoard(), FakeBurner()
    burning_during: list[int | None] = []

    async def go() -> Any:
        side = asyncio.create_task(
            run_neighbour(board, cpu_share=0.5, node="n1", deadline_s=60, burner=burner,
                          node_cpus=2, allowed=[0, 1], beside="svc-a", beside_qos="Burstable",
                          poll_s=0.01)
        )  # fmt: skip

        async def watch() -> None:
            while not side.done():
                burning_during.append(burner.burning)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        result = await run_benchmark(
            _spec(noisyNeighbour={"cpuShare": 0.5}),
            RunOptions(endpoint=server.url, model="fake-model"),
            neighbour_board=board,
        )
        why = await asyncio.wait_for(side, 5)
        await watcher
        return result, why

    result, why = timing.run(go())
    (chaos,) = result.chaos
    assert chaos.perturbation == (
        "noisy neighbour: 1 CPU burnt on node n1 beside pod svc-a (Burstable QoS), "
        "on all CPUs (0-1)"
    )
    assert why == "done" and burner.burning is None and burner.starts == 1
    assert 1 in burning_during
    assert chaos.perturbed.stats.completed == 10


def test_a_neighbour_without_its_config_map_fails_before_any_level(
    fake_server: ServerFactory,
) -> None:
    server = fake_server(Config())
    with pytest.raises(BenchmarkError, match=r"spec\.chaos\.noisyNeighbour: no neighbour"):
        timing.run(
            run_benchmark(
                _spec(noisyNeighbour={}), RunOptions(endpoint=server.url, model="fake-model")
            )
        )


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--cpu-share", "0"], "--cpu-share: must be above 0 and at most 1"),
        (["--cpu-share", "1.5"], "--cpu-share: must be above 0 and at most 1"),
    ],
)
def test_the_neighbour_command_refuses_a_share_outside_its_range(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["noisy-neighbour", "--config-map", "c", "--namespace", "n", "--deadline-seconds", "5"]
    assert cli_main([*argv, *flags]) == 2
    assert words in capsys.readouterr().err
