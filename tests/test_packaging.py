"""The built wheel works on its own: namespaced subpackages and the bundled specs ship inside it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_loads_an_environment_and_plugs_into_gymnasium(tmp_path: Path) -> None:
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
        "import importlib.util; s = importlib.util.find_spec('agents'); print(s.origin if s else None)"
    )
    out = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    module_file, env_dir_line, title, top_level_agents = out.stdout.strip().splitlines()
    assert str(env_dir) in module_file and str(env_dir) in env_dir_line
    assert title == "Iron Man"
    # (openai-agents, a dependency of the verifiers extra, has a top-level `agents`: only ours is an error)
    assert str(env_dir) not in top_level_agents, "no top-level `agents` module may be installed"
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if n.startswith(("agents/", "auditors/"))]

    # The Gymnasium plugin: a fresh interpreter that never imports ncpbench can make and step an env,
    # gets the stand-in auditor's warning, and sees the ids under the ncpbench namespace.
    gym_probe = (
        "import sys, warnings, io, contextlib\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import gymnasium as gym\n"
        "    env = gym.make('ncpbench/IronMan-v1'); env.reset(seed=0); obs, *_ = env.step('An opening.')\n"
        "print('ncpbench' in sys.modules and 'imported by the hook')\n"
        "print(obs['turn'], bool(obs['player_action']))\n"
        "print(any('NOT a judge' in str(w.message) for w in caught if issubclass(w.category, UserWarning)))\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    gym.pprint_registry()\n"
        "print('ncpbench/IronMan-v1' in buf.getvalue() and '===== ncpbench =====' in buf.getvalue())\n"
    )
    out = subprocess.run([str(py), "-c", gym_probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["imported by the hook", "1 True", "True", "True"], out.stdout
    # ncpbench imports Gymnasium itself: the hook must stand aside then (no circular import, no warning)
    first = subprocess.run([str(py), "-W", "error::RuntimeWarning", "-c",
                            "import ncpbench, gymnasium as gym; print('ncpbench/IronMan-v1' in gym.registry)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert first.returncode == 0 and first.stdout.strip() == "True", first.stderr
    off = subprocess.run([str(py), "-c", "import gymnasium as gym; print('ncpbench/IronMan-v1' in gym.registry)"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": "", "NCPBENCH_GYM_PLUGIN": "0"})
    assert off.stdout.strip() == "False", off.stderr
