"""The working directory: manifest, step folders, staleness, locking.

Layout::

    WORKDIR/
      manifest.json         index of finished steps (atomic writes)
      .lock                 flock held while a step runs
      .staging/<step>/      a step's output while it runs (renamed into place at the end)
      .staging/<step>.commit.json   journal of a commit in progress (see journal.py)
      <step>/step.json      params, inputs, outputs, metrics, timing, versions, argv, status
      <step>/...            the step's artifacts

A step asks for its inputs by step name (``ws.output("quantize", needed_by)``); it is
up to date when its fingerprint (params + input hashes) matches the manifest
and its outputs are intact, and stale when an upstream step's outputs changed.
"""

from gencli.workspace.manifest import read_json, write_json_atomic
from gencli.workspace.workspace import DEFAULT_WORKDIR, StepRun, Workspace, default_workdir

__all__ = ["Workspace", "StepRun", "DEFAULT_WORKDIR", "default_workdir", "read_json", "write_json_atomic"]
