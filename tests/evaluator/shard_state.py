"""A shard's persisted state for tests that run the shard runner without Spark's state store."""

from __future__ import annotations

from evaluator.spark.shard_runner import BatchResult


class State:
    """A shard's persisted state, written as the operator writes a result."""

    def __init__(self) -> None:
        self.base: bytes | None = None
        self.log: dict[int, bytes] = {}
        self.clock = (0, 0)
        self.reads = 0

    def snapshot(self) -> bytes | None:
        self.reads += 1
        return self.base

    def log_entry(self, epoch: int) -> bytes | None:
        self.reads += 1
        return self.log.get(epoch)

    def write(self, result: BatchResult) -> None:
        if result.snapshot is not None:
            self.base, self.log = result.snapshot, {}
        else:
            assert result.delta is not None
            self.log[result.epoch] = result.delta
        self.clock = (result.epoch, result.base_epoch)
