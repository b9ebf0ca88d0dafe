"""Run bench/gmax_sweep.py with GMAX's calm guard on (``calm_delta_per_frame`` 50, ``calm_window_s``
30) in this process: ``--workers 1`` (spawned workers would not see the changed defaults).

    PYTHONPATH=core:lab .venv/bin/python bench/results/gmax/issue15/fourteenth_screens/calm_sweep.py \\
        run --out OUT --duration 300 --workers 1 --seeds 0,1,2 --policies gmax --families tot \\
        --replicas 4 --rps overload --objective token \\
        --points bench/results/standard_sweep/issue20_points/load_points.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # bench/

sys.path.insert(0, str(Path(__file__).resolve().parent))  # screen.py beside it

import gmax_sweep
from screen import _calm_guard

if __name__ == "__main__":
    if "--workers" not in sys.argv or sys.argv[sys.argv.index("--workers") + 1] != "1":
        raise SystemExit("run with --workers 1")
    _calm_guard(50.0, 30.0)
    raise SystemExit(gmax_sweep.main())
