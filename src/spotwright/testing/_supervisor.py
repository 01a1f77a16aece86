"""Process supervision for the test cluster: free ports, starting each component in its own
process group with its log file, waiting for health while watching that none has died,
and stopping them so that nothing is left behind.

Each component runs in its own session (process group), so stopping it reaches whatever it
forked. Started from the main thread on Linux, the children also get ``PR_SET_PDEATHSIG``:
a test runner killed with SIGKILL takes its control plane with it, and the work directory
it leaves is swept by the next cluster (:func:`sweep_stale_workdirs`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotwright.testing._errors import ClusterStartError

WORKDIR_PREFIX = "spotwright-testcluster-"
OWNER_FILE = ".owner-pid"


@dataclass
class Component:
    """One running binary of the control plane, with the log its output goes to."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log_file: Any = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def pdeathsig() -> Callable[[], None] | None:
    """A preexec function that asks Linux to SIGKILL the child when its parent thread dies.

    Only from the main thread: the signal fires when the *thread* that forked exits, so a
    cluster started from a worker thread would die with that thread.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return preexec


def sweep_stale_workdirs() -> None:
    """Remove work directories left by clusters whose process died without stopping them
    (a test runner killed with SIGKILL, say: its children die with it, its files do not).

    Only directories that still name an owner process, and whose owner is gone, are
    removed; kept directories (start-up failures, ``SPOTWRIGHT_TESTCLUSTER_KEEP``) name none.
    """
    for candidate in Path(tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        try:
            pid = int((candidate / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(candidate, ignore_errors=True)
        except PermissionError:
            continue  # alive, someone else's


def open_url(request: urllib.request.Request, *, timeout: float, context: ssl.SSLContext) -> Any:
    """urlopen without proxies: the cluster is on loopback, whatever HTTPS_PROXY says."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    return opener.open(request, timeout=timeout)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def http_ok(url: str, *, verify: bool) -> bool:
    """Whether ``url`` answers 200; ``verify=False`` for the components' self-signed ports."""
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with open_url(urllib.request.Request(url), timeout=5, context=context) as response:
        return bool(response.status == 200)


def launch(name: str, argv: list[str], *, log_dir: Path, cwd: Path) -> Component:
    """Start ``argv`` in a new session, output appended to ``log_dir/<name>.log`` after the
    command line, so a failed start can be replayed from the log alone."""
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("ab")
    log_file.write(f"$ {' '.join(argv)}\n".encode())
    log_file.flush()
    component = Component(name=name, argv=argv, log_path=log_path, log_file=log_file)
    component.process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env={**os.environ, "HOME": str(cwd)},  # kwok looks in ~/.kwok
        start_new_session=True,
        preexec_fn=pdeathsig(),  # prctl only: safe between fork and exec
    )
    return component


def wait_until(
    what: str,
    check: Callable[[], bool],
    components: Sequence[Component],
    *,
    timeout: float,
    log_path: Path | None = None,
) -> None:
    """Poll ``check`` (connection errors count as not yet) with a growing delay until it
    holds; raise :class:`ClusterStartError` at once when any component dies, with its log
    tail, and after ``timeout`` seconds with the tail of ``log_path``."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        for proc in components:
            if not proc.alive():
                code = proc.process.returncode if proc.process else None
                raise ClusterStartError(
                    f"{proc.name} exited with code {code} while waiting for {what}; "
                    f"last lines of {proc.log_path}:\n{tail(proc.log_path)}"
                )
        with contextlib.suppress(OSError, ValueError, ssl.SSLError):
            if check():
                return
        if time.monotonic() > deadline:
            hint = f"; last lines of {log_path}:\n{tail(log_path)}" if log_path else ""
            raise ClusterStartError(f"timed out waiting for {what}{hint}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def terminate(component: Component, grace: float = 10.0) -> None:
    """SIGTERM the component's process group, then SIGKILL whatever is left after ``grace``
    seconds, and close its log."""
    proc = component.process
    if proc is not None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        # Whatever is left in the group (the leader may have exited already) goes now.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    if component.log_file is not None:
        component.log_file.close()
