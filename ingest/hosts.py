"""The second demo stream: host metrics (``hosts``), a schema unlike ``trades``.

Key ``host``, time ``time`` as ISO-8601 text (trades: epoch ms under ``ts``),
attributes ``cpu``, ``mem`` and ``disk`` in percent (0-100), dimension ``region``.
:class:`HostMetrics` plays a fleet of hosts reporting every interval, as a
collector would send them over HTTP: CPU wanders around a per-host baseline with
occasional bursts (something for a ``MAX(cpu) OVER 1m > 90`` alert to catch),
memory drifts slowly, disks fill up slowly. Deterministic for a given seed and start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from core.settings import Settings
from core.streams import Attribute, Dimension, StreamSchema

HOSTS = "hosts"
REGIONS = ("eu-west", "us-east", "ap-south")
ROLES = ("web", "db", "cache", "batch")


def hosts_schema(settings: Settings) -> StreamSchema:
    """What the local platform declares at start-up for the host-metrics demo."""
    percent = {"unit": "%", "min": 0, "max": 100}
    return StreamSchema(
        name=HOSTS, key_field="host", time_field="time", time_format="iso8601",
        attributes=tuple(Attribute.model_validate({"name": name, **percent}) for name in ("cpu", "mem", "disk")),
        dimensions=(Dimension(name="region", max_length=32),),
        retention_ms=settings.stream_default_retention_ms, partitions=settings.event_partitions)


def iso_ms(ms: int) -> str:
    """``2026-01-02T09:30:00.250Z``: ISO-8601 with milliseconds and a zone, as the schema wants."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class HostMetrics:
    hosts: int = 12
    seed: int = 7
    start_ms: int = 0
    interval_ms: int = 1_000
    burst_probability: float = 0.02
    names: list[str] = field(init=False)
    regions: list[str] = field(init=False)
    _rng: np.random.Generator = field(init=False, repr=False)
    _cpu_base: np.ndarray = field(init=False, repr=False)
    _mem: np.ndarray = field(init=False, repr=False)
    _disk: np.ndarray = field(init=False, repr=False)
    _clock_ms: int = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self.names = [f"{ROLES[i % len(ROLES)]}-{i // len(ROLES) + 1:02d}" for i in range(self.hosts)]
        self.regions = [REGIONS[i % len(REGIONS)] for i in range(self.hosts)]
        self._cpu_base = self._rng.uniform(10, 50, self.hosts)
        self._mem = self._rng.uniform(30, 70, self.hosts)
        self._disk = self._rng.uniform(20, 80, self.hosts)
        self._clock_ms = self.start_ms

    @property
    def clock_ms(self) -> int:
        """Event time of the last report (every host has reported up to it)."""
        return self._clock_ms

    def advance(self) -> list[str]:
        """One report per host for the next interval: JSON texts in the stream's own (publisher) form."""
        self._clock_ms += self.interval_ms
        n = self.hosts
        bursts = self._rng.random(n) < self.burst_probability
        cpu = np.where(bursts, self._rng.uniform(85, 100, n), self._cpu_base + self._rng.normal(0, 6, n))
        self._mem = self._mem + self._rng.normal(0, 0.5, n)
        self._disk = self._disk + self._rng.uniform(0, 0.02, n)
        values = [np.clip(np.round(v, 1), 0, 100) for v in (cpu, self._mem, self._disk)]
        self._mem, self._disk = values[1], np.where(values[2] >= 100, 20.0, values[2])  # a full disk is cleaned
        time = iso_ms(self._clock_ms)
        return [json.dumps({"host": self.names[i], "time": time, "cpu": float(values[0][i]), "mem": float(values[1][i]),
                            "disk": float(values[2][i]), "region": self.regions[i]}) for i in range(n)]
