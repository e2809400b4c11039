"""The pure planner loads without torch: a host that only plans (a test, a tool, a daemon-side check) needs none."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_planner_loads_no_torch() -> None:
    code = (
        "import sys\n"
        "import slurm_amoeba.agent.plan\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", f"slurm_amoeba.agent.plan pulled in torch: {done.stdout.strip()[:300]}"
