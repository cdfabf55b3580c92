"""`make` set-up on a machine where another package manager is busy: it waits for the
apt/dpkg lock (bounded), then goes on, or stops with one clear line. The lock here is a file
of the test's own (APT_LOCKS), taken with fcntl like apt and dpkg take theirs."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_apt_wait(lock: Path, wait: int) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    assert make, "make is not installed"
    return subprocess.run([make, "-s", "apt-wait", f"APT_LOCKS={lock}", f"APT_LOCK_WAIT={wait}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_free_lock_passes_at_once(tmp_path):
    result = make_apt_wait(tmp_path / "lock", 5)
    assert result.returncode == 0 and result.stderr == ""


def test_a_held_lock_is_waited_for_then_given_up_with_one_clear_line(tmp_path):
    lock = tmp_path / "lock"
    with lock.open("a") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)
        result = make_apt_wait(lock, 2)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: another package manager still holds the apt/dpkg lock after 2s "
                      f"({lock}); let it finish (or raise APT_LOCK_WAIT) and run make again"]
    assert "waiting for another package manager" in result.stderr


def test_a_lock_released_while_waiting_lets_set_up_go_on(tmp_path):
    lock = tmp_path / "lock"
    held = lock.open("a")
    fcntl.lockf(held, fcntl.LOCK_EX)
    waiting = threading.Event()

    def release_once_make_waits() -> None:
        waiting.wait(60)
        held.close()  # closing the file drops its fcntl lock

    threading.Thread(target=release_once_make_waits, daemon=True).start()
    make = shutil.which("make")
    assert make
    proc = subprocess.Popen([make, "-s", "apt-wait", f"APT_LOCKS={lock}", "APT_LOCK_WAIT=60"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # make says it waits: now let go
    assert first.startswith("waiting for another package manager"), first
    waiting.set()
    assert proc.wait(timeout=60) == 0
