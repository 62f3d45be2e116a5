"""What a delivery worker and a dispatcher load: not pandas, Arrow or PySpark, which they never use.

They came in through modules a worker imports for their small parts (stream schemas, the series registry, the
backtest task the Celery app includes): each worker process held ~190 MB after its imports instead of ~120,
and took ~1.2 s to import them. Checked in a fresh interpreter, as a worker starts.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("pandas", "pyarrow", "pyspark")


def test_a_worker_and_a_dispatcher_import_no_dataframe_library() -> None:
    script = ("import json, sys\n"
              "import notifier.app, notifier.dispatcher, notifier.worker\n"
              "for module in notifier.app.app.conf.include:\n"  # the task modules every worker imports
              "    __import__(module)\n"
              f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
