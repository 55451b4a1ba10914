"""The measurements store: the ConfigMap ``vllm-operator-measurements`` in the operator's
own namespace, one measured record per data key (tuning/measurements.py says what a
record holds and how its key is made).

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

from vllm_operator.constants import LABEL_MANAGED_BY, MANAGED_BY, MEASUREMENTS_CONFIG_MAP
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.tuning.measurements import Measurement, Measurements, MeasurementsError

__all__ = ["read_measurements", "record_measurements"]


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
