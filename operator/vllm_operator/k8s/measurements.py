"""The measurements store: the ConfigMap ``vllm-operator-measurements`` in the operator's
own namespace, one measured record per data key (tuning/measurements.py says what a
record holds and how its key is made).

:func:`read_for_plans` is what the InferenceService plans read (through the runtime's
short-lived cache, runtime/measurements.py): never an error, whatever the store holds.

:func:`record_measurements` is what a measured tuning run calls when it ends. It merges:
a JSON merge patch of ``data`` with the new records' keys only, so every other key stays
whoever wrote it (a patch, never a replace, and never a server-side apply of ``data``: an
apply would drop the keys this field manager applied before and left out now). A record
older than the one its key holds is not written. The chart creates the ConfigMap (empty,
labelled as the operator's, kept on uninstall); where it is missing the first records
create it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vllm_operator.constants import LABEL_MANAGED_BY, MANAGED_BY, MEASUREMENTS_CONFIG_MAP
from vllm_operator.k8s.api import ApiError, ClusterAPI
from vllm_operator.tuning.measurements import Measurement, Measurements, MeasurementsError

__all__ = ["StoredMeasurements", "read_for_plans", "read_measurements", "record_measurements"]


@dataclass(frozen=True)
class StoredMeasurements:
    """The store as the plans read it: the records that parse, and one line for each
    that does not (naming its key) or for a store that could not be read at all."""

    measurements: Measurements = field(default_factory=Measurements)
    unread: tuple[str, ...] = ()


async def read_for_plans(api: ClusterAPI, namespace: str) -> StoredMeasurements:
    """The records for the InferenceServices' plans, never an error: a missing ConfigMap
    is no record, one the API does not give (forbidden, unreachable, a transient error
    included: the plan goes on without it) and a record that does not parse are lines
    to note, the other records are read."""
    where = f"ConfigMap {namespace}/{MEASUREMENTS_CONFIG_MAP}"
    try:
        found = await api.get("v1", "ConfigMap", MEASUREMENTS_CONFIG_MAP, namespace)
    except ApiError as err:
        return StoredMeasurements(
            unread=(f"{where} could not be read ({str(err)[:200]}); planned without it",)
        )
    if found is None:
        return StoredMeasurements()
    measurements, skipped = Measurements.readable(found)
    return StoredMeasurements(measurements, tuple(f"{where}: {line}; skipped" for line in skipped))


async def read_measurements(api: ClusterAPI, namespace: str) -> Measurements:
    """The stored records (none when the ConfigMap does not exist). A key that does not
    hold a record is a :class:`MeasurementsError` naming it."""
    found = await api.get("v1", "ConfigMap", MEASUREMENTS_CONFIG_MAP, namespace)
    return Measurements() if found is None else Measurements.from_config_map(found)


async def record_measurements(
    api: ClusterAPI, namespace: str, records: Iterable[Measurement]
) -> list[str]:
    """Merge ``records`` into the store in ``namespace``; returns the keys written.

    Keys the ConfigMap holds and ``records`` do not are left as they are; a stored record
    that does not parse is left too (and not read). Raises ``ApiError`` as the API does
    (a transient one: try again; the merge is idempotent)."""
    new = Measurements.of(records)
    if not new:
        return []
    current = await api.get("v1", "ConfigMap", MEASUREMENTS_CONFIG_MAP, namespace)
    if current is None:
        manifest = new.config_map(namespace)
        manifest["metadata"]["labels"] = {LABEL_MANAGED_BY: MANAGED_BY}
        await api.apply(manifest)
        return list(new.records)
    stored = current.get("data") or {}
    data = new.data()
    for key in list(data):
        if key not in stored:
            continue
        try:
            old = Measurements.from_config_map({"data": {key: stored[key]}})
        except MeasurementsError:
            continue  # unreadable: the new record replaces it
        if any(r.measured_at > new.records[key].measured_at for r in old):
            del data[key]
    if data:
        await api.patch("v1", "ConfigMap", MEASUREMENTS_CONFIG_MAP, namespace, {"data": data})
    return list(data)
