"""Plans that learn from measurements: the records measured tuning runs kept
(tuning/measurements.py) of a plan's shape are read back into the plan.

A plan is made twice where a record of its shape exists. The first plan, from the roofline
alone, says the shape: the model, the GPU product, the GPUs per replica and the vLLM
version (:class:`~vllm_operator.tuning.measurements.Shape`). The records of that shape are
then looked at, latest first, those of the plan's own arguments before the others. The
latest record that **applies** becomes a :class:`~vllm_operator.tuning.slo.Measured` and
the plan is made again with it (:func:`plan_learning`); every record of the shape (up to
:data:`MAX_NOTED`) gets a note with its figure, the prediction beside it and the error, and
whether it was used and why not.

A record applies when it answers the plan's own question: the plan's arguments (every flag
the record sets has the plan's value), the same SLO targets, and a workload whose mean
prompt and output lengths are within :data:`SAME_LENGTHS` of the plan's (a service that
declares no lengths has none to compare). A record of other arguments is a measurement of
another configuration: it is noted beside the plan, never used for it.

**What a record becomes** (approximations, said here and in docs/measurements.md):

- ``goodput_per_second``: the measured goodput over the replicas it was measured on
  (``replicas``, 1 for a trial beside the service), as one replica's;
- ``concurrency``: the requests one replica held in flight at that goodput, by Little's
  law over the measured medians, ``goodput x (TTFT P50 + (mean output - 1) x TPOT P50)``
  (the medians stand in for the means the law wants; a long tail makes this an
  underestimate). A shape of the record's GPUs per replica whose share of the peak is
  within it meets the targets, one whose share exceeds it does not, whatever the roofline
  predicted (tuning/slo.py, ``measured_misses``);
- ``decode_tokens_per_second``: ``1000 / TPOT P50`` only where about one request was in
  flight (``concurrency`` at most :data:`ONE_AT_A_TIME`): then a step decoded one sequence
  and the measured TPOT is its rate. At a larger batch the TPOT mixes in other sequences'
  prefill and KV reads, and no rate is derived (the roofline's bandwidth share stays).

**The error** beside each record is ``measured / predicted - 1`` of the goodput: the
prediction is the first plan's (the roofline's, scaled to the record's replicas) for a
record of the plan's arguments, else the prediction the record carries from its run.

Pure: the caller reads the records (``k8s/measurements.py`` for the operator, a file for
``vllm-operator tune``) and passes what could not be read as lines to note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Final

from vllm_operator.tuning.measurements import Comparison, Measurement, Measurements, compare
from vllm_operator.tuning.results import DoesNotFit, Plan
from vllm_operator.tuning.slo import Measured, PlanInputs, Targets

__all__ = [
    "MAX_NOTED",
    "ONE_AT_A_TIME",
    "SAME_LENGTHS",
    "Learned",
    "learn",
    "measured_of",
    "plan_learning",
]

# Mean prompt and output lengths within this share of the plan's: the same workload.
SAME_LENGTHS: Final = 0.10
# Requests in flight at or below which a measured TPOT is one sequence's decode rate.
ONE_AT_A_TIME: Final = 1.5
# Records of a shape noted beside a plan (the latest; the used one always).
MAX_NOTED: Final = 5


@dataclasses.dataclass(frozen=True)
class Learned:
    """What the records of a plan's shape give it: the figure to plan with (None: no
    record applies) and one note per record."""

    measured: Measured | None
    notes: tuple[str, ...]
    used: str | None = None  # the key of the record used


def _by(record: Measurement) -> str:
    day = record.measured_at.strftime("%Y-%m-%d")
    t = record.tuning
    return f"tuning {t.namespace}/{t.name} trial {t.trial}, {day}" if t else day


def measured_of(record: Measurement) -> Measured:
    """The figures the planner takes from ``record`` (the module docstring says how)."""
    per_replica = record.goodput_per_second / record.replicas
    output = record.workload.output_tokens_mean
    seconds = (record.ttft.p50 + max(0.0, output - 1) * record.tpot.p50) / 1000
    in_flight = per_replica * seconds
    decode = 1000 / record.tpot.p50 if in_flight <= ONE_AT_A_TIME and record.tpot.p50 > 0 else None
    return Measured(
        decode_tokens_per_second=decode,
        goodput_per_second=per_replica,
        tensor_parallel=record.gpu_count,
        source=_by(record),
        concurrency=in_flight,
    )


def _close(measured: float, planned: float) -> bool:
    return abs(measured - planned) <= SAME_LENGTHS * planned


def _not_applying(c: Comparison, inputs: PlanInputs) -> str | None:
    """Why a record does not answer the plan's question; None when it does."""
    if not c.same_arguments:
        return "measured with other arguments"
    r, ask = c.record, inputs.ask
    if Targets.of(r.slo) != Targets.of(ask.slo):
        return "measured against another SLO"
    if ask.prompt is None or ask.output is None:
        return "the service declares no request lengths to compare its workload with"
    w = r.workload
    if not (
        _close(w.prompt_tokens_mean, ask.prompt.mean)
        and _close(w.output_tokens_mean, ask.output.mean)
    ):
        return (
            f"measured under another workload (mean prompt {w.prompt_tokens_mean:,.0f}, "
            f"output {w.output_tokens_mean:,.0f} tokens; the plan's {ask.prompt.mean:,.0f}, "
            f"{ask.output.mean:,.0f})"
        )
    return None


def _slo_words(record: Measurement) -> str:
    targets = Targets.of(record.slo).items()
    if not targets:
        return "with no SLO target"
    return "meeting " + " and ".join(f"{m} P99 {t:,} ms" for m, t in targets)


def _arguments_words(c: Comparison) -> str:
    if c.same_arguments:
        return "with the plan's arguments"
    return "with " + ", ".join(
        f"{flag} {measured if measured not in (None, '') else 'on'}"
        for flag, (_, measured) in c.differences.items()
    )


def _note(c: Comparison, why_not: str | None) -> str:
    r = c.record
    text = (
        f"measured: {r.goodput_per_second:,.1f} req/s {_slo_words(r)} {_arguments_words(c)} "
        f"on {r.replicas} replica(s) of {r.gpu_count} {r.gpu_product} ({_by(r)}; key {c.key})"
    )
    if c.predicted_goodput_per_second is not None:
        text += f"; predicted {c.predicted_goodput_per_second:,.1f}"
        if c.error is not None:
            text += f" (error {c.error * 100:+.0f} %)"
    else:
        text += "; no prediction to compare with"
    if why_not is None:
        return text + "; used for the SLO answer in place of the roofline's figures"
    return text + f"; not used: {why_not}"


def learn(first: Plan, measurements: Measurements, *, version: str | None) -> Learned:
    """What the records of ``first``'s shape (on vLLM ``version``) give it."""
    inputs = first.inputs
    if not isinstance(inputs, PlanInputs):
        return Learned(None, ())
    # The roofline's goodput of one replica of the plan, for records of its arguments.
    answer = first.slo
    per_replica = (
        answer.goodput_per_second / answer.replicas
        if answer is not None and answer.goodput_per_second is not None
        else None
    )
    judged: list[tuple[Comparison, str | None]] = []
    chosen: Comparison | None = None
    for c in compare(dataclasses.replace(first, vllm_version=version), measurements):
        if c.same_arguments and per_replica is not None:
            predicted = per_replica * c.record.replicas
            error = c.record.goodput_per_second / predicted - 1 if predicted else None
            c = dataclasses.replace(c, predicted_goodput_per_second=predicted, error=error)
        why_not = _not_applying(c, inputs)
        if why_not is None and chosen is not None:
            why_not = f"the later measurement {chosen.key} is used"
        elif why_not is None:
            chosen = c
        judged.append((c, why_not))
    # The record used first, then the others as found (the plan's arguments, latest first).
    judged.sort(key=lambda item: item[1] is not None)
    notes = [_note(c, why_not) for c, why_not in judged[:MAX_NOTED]]
    if len(judged) > MAX_NOTED:
        notes.append(f"measured: {len(judged) - MAX_NOTED} older record(s) of this shape not shown")
    if chosen is None:
        return Learned(None, tuple(notes))
    return Learned(measured_of(chosen.record), tuple(notes), chosen.key)


def plan_learning(
    plan_with: Callable[[Measured | None], Plan | DoesNotFit],
    measurements: Measurements | None,
    *,
    version: str | None,
    unread: Sequence[str] = (),
) -> Plan | DoesNotFit:
    """The plan ``plan_with`` makes, learned from ``measurements``: made without a
    measurement, then, where a record of its shape applies, again with it; the records'
    notes (and ``unread``: records or stores that could not be read, one line each) added
    to a plan's notes. The same for the operator and ``vllm-operator tune``."""
    first = plan_with(None)
    if not isinstance(first, Plan):
        return first
    learned = learn(first, measurements, version=version) if measurements else Learned(None, ())
    result = plan_with(learned.measured) if learned.measured is not None else first
    notes = (*learned.notes, *(f"measurements: {line}" for line in unread))
    if not notes or not isinstance(result, Plan):
        return result
    return dataclasses.replace(result, notes=(*result.notes, *notes))
