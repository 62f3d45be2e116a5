"""A checkpoint's files read and written through Hadoop's FileSystem API, in the driver's JVM.

Spark writes a query's checkpoint (``checkpointLocation``) through Hadoop's FileSystem, resolving
the location against the session's Hadoop configuration: a plain path on the default file system,
a URI on its scheme's (``file://``, ``hdfs://``, ``s3a://`` with the jars that scheme needs,
docs/cluster.md). What Tocsin reads and writes beside it (the offset log's shuffle partitions, a
stream's incarnation and attribute columns, removing a stream's checkpoint) goes the same way, so
it sees the very files Spark wrote wherever they are, not the local disk's copy of a path. Only the
driver has the JVM this needs; processes without one (the web app, the devstack runner) do not read
checkpoints.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


def child(location: str, *names: str) -> str:
    """``location``/``names``: a path or URI under a checkpoint location (a URI's scheme and authority kept)."""
    return "/".join([location.rstrip("/"), *names]) if names else location


class CheckpointFiles:
    """The files under one checkpoint location; ``name`` arguments are relative to it (``"offsets/3"``)."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.location = location
        self._jvm: Any = spark._jvm  # py4j: the session's JVM
        # The configuration a streaming query resolves its checkpoint with (SQL confs' spark.hadoop.* included)
        conf = spark._jsparkSession.sessionState().newHadoopConf()
        self._fs: Any = self._path().getFileSystem(conf)

    def _path(self, name: str = "") -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(child(self.location, name) if name else self.location)

    def exists(self, name: str = "") -> bool:
        return bool(self._fs.exists(self._path(name)))

    def names(self, name: str = "") -> list[str]:
        """The names in a directory ([] if it is not there)."""
        path = self._path(name)
        if not self._fs.exists(path):
            return []
        return [str(status.getPath().getName()) for status in self._fs.listStatus(path)]

    def read_text(self, name: str) -> str | None:
        """A file's text (None if it is not there)."""
        path = self._path(name)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            data: bytes = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return data.decode("utf-8", "replace")

    def write_text(self, name: str, text: str) -> None:
        """Create or replace a file (its parent directories made as needed)."""
        stream = self._fs.create(self._path(name), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def mkdirs(self, name: str = "") -> None:
        self._fs.mkdirs(self._path(name))

    def delete(self, name: str = "") -> bool:
        """Remove a file or a directory with everything in it; False if there was nothing."""
        return bool(self._fs.delete(self._path(name), True))
