"""The built wheel works on its own: namespaced subpackages and the bundled specs ship inside it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_loads_an_environment(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("ncpbench-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # Dependencies come from this interpreter's site-packages (no network, no index), but .pth files
    # there (our editable install) are not processed, so ncpbench itself must come from the wheel.
    purelib = sysconfig.get_paths()["purelib"]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(purelib + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = (
        "import ncpbench, ncpbench.agents, ncpbench.auditors, ncpbench.dataset as d;"
        "import ncpbench.reports, ncpbench.metrics, ncpbench.runner, ncpbench.models.local, ncpbench.auditeval;"
        "print(ncpbench.__file__); print(d.bundled_dir());"
        "spec = ncpbench.get_spec('iron-man'); print(spec.meta.title);"
        "import importlib.util; print(importlib.util.find_spec('agents'))"
    )
    out = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    module_file, env_dir_line, title, top_level_agents = out.stdout.strip().splitlines()
    assert str(env_dir) in module_file and str(env_dir) in env_dir_line
    assert title == "Iron Man"
    assert top_level_agents == "None", "no top-level `agents` module may be installed"
