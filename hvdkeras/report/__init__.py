"""`hvdkeras report RUN_DIR`: a run's curves and where its steps' time went,
as PNGs and one self-contained HTML page.

* `run_data` (pure): what a run directory holds (the per-epoch history from
  the CSV log or `run.json`, the run's summary, engine timelines).
* `timeline_phases` (pure): the engine's time by phase from a timeline.
* `charts`: the PNGs (matplotlib, the `report` extra).
* `page` (pure): the HTML page around them.
* `writer`: all of it into `RUN_DIR/report/`, atomically.
* `step_picture`: one training step's gradient reductions against the
  backward pass, from a timeline (the synthetic benchmark's lab mode).

What may import it: the CLI and the recipes' launching code. It imports
nothing of hvdkeras, and matplotlib only when charts are drawn.
"""

from hvdkeras.report.writer import ReportError, write_report

__all__ = ["ReportError", "write_report"]
