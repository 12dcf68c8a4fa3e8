"""Writes a run's report into `RUN_DIR/report/`: the PNGs and `index.html`.

Each file is written to a temporary name and renamed, so a reader never
sees half a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hvdkeras.report import charts, page, timeline_phases
from hvdkeras.report.run_data import load_run

REPORT_DIR = "report"


class ReportError(RuntimeError):
    """A run directory the report cannot be made from, or matplotlib missing."""


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_report(run_dir: str | os.PathLike) -> Path:
    """Draws a run's charts and writes its HTML page.

    Args:
        run_dir: A run directory (what a recipe's `callbacks.csv_logger`
            and checkpoints write into, e.g. `runs/digits`).

    Returns:
        The path of `RUN_DIR/report/index.html`; the PNGs lie beside it.

    Raises:
        ReportError: naming the problem (no directory, no history,
            matplotlib not installed).

    Example:

    ```python
    from hvdkeras.report import write_report
    print(write_report("runs/digits"))
    ```
    """
    try:
        run = load_run(Path(run_dir))
    except (OSError, ValueError) as error:
        raise ReportError(str(error)) from None
    out = run.directory / REPORT_DIR
    out.mkdir(exist_ok=True)
    drawings = [("curves.png", lambda p: charts.curves(run, p)),
                ("learning_rate.png", lambda p: charts.learning_rate(run, p)),
                ("throughput.png", lambda p: charts.throughput(run, p)),
                ("step_time.png", lambda p: charts.step_time(run, p)),
                ("traffic.png", lambda p: charts.traffic(run, p))]
    for i, trace in enumerate(run.timelines):
        totals = timeline_phases.phase_totals_ms(timeline_phases.read_events(trace))
        drawings.append((f"timeline_phases{'' if i == 0 else f'_{i + 1}'}.png",
                         lambda p, t=totals, name=trace.name: charts.timeline_phases(t, p, name)))
    pictures = []
    try:
        for name, draw in drawings:
            scratch = out / f".{name}.drawing.png"
            caption = draw(scratch)
            if caption is None:
                continue
            data = scratch.read_bytes()
            scratch.unlink()
            _atomic_write(out / name, data)
            pictures.append((name, caption, data))
    except ImportError as error:
        raise ReportError(str(error)) from None
    index = out / "index.html"
    _atomic_write(index, page.render(run, pictures).encode())
    return index
