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


FAKE_APT = r"""#!/usr/bin/env bash
# apt-get as the test sees it: records its arguments, talks as much as apt does, and on
# install "enables" the packages' units and asks policy-rc.d whether it may start them.
echo "$*" >> "$RECORD/apt-args"
for i in $(seq 1 200); do echo "Selecting previously unselected package lib$i."; done
if [[ " $* " == *" install "* ]]; then
  if [ -x "$POLICY_RC_D" ]; then
    "$POLICY_RC_D" prometheus.service start; echo "policy=$?" >> "$RECORD/policy"
  else
    echo "policy=none" >> "$RECORD/policy"
  fi
  echo prometheus.service >> "$RECORD/enabled"
  echo prometheus-node-exporter.service >> "$RECORD/enabled"
fi
"""
FAKE_SYSTEMCTL = r"""#!/usr/bin/env bash
# systemctl over a file of enabled units
case "$1" in
  list-unit-files) touch "$RECORD/enabled"; sed 's/$/ enabled enabled/' "$RECORD/enabled" ;;
  disable) unit="${@: -1}"; echo "disable $*" >> "$RECORD/systemctl"
           grep -vx "$unit" "$RECORD/enabled" > "$RECORD/e2" || true
           mv "$RECORD/e2" "$RECORD/enabled" ;;
esac
"""


def test_setup_installs_only_what_it_names_starts_nothing_and_says_one_line(tmp_path):
    """make's Debian step: --no-install-recommends, quiet, a policy-rc.d that forbids starts
    while apt runs (removed after), units the packages enabled disabled again, one line."""
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    for name, text in (("apt-get", FAKE_APT), ("systemctl", FAKE_SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (record / "enabled").write_text("ssh.service\n")  # the machine's own: left alone
    policy = tmp_path / "policy-rc.d"
    make = shutil.which("make")
    assert make
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record), "SUDO": "",
           "APT_GET": str(bin_dir / "apt-get"), "SYSTEMCTL": str(bin_dir / "systemctl"),
           "POLICY_RC_D": str(policy), "APT_LOG": str(tmp_path / "apt.log")}
    result = subprocess.run([make, "-s", "debs", "MISSING_DEBS=prometheus chromium prometheus",
                             f"APT_LOCKS={tmp_path / 'lock'}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "installing Debian packages: chromium prometheus (no recommended packages; no service "
        f"enabled or started; apt log: {tmp_path / 'apt.log'})"]
    assert result.stderr == ""
    calls = (record / "apt-args").read_text().splitlines()
    assert len(calls) == 2 and " update -qq" in calls[0]
    assert calls[1].endswith("install -y -qq --no-install-recommends chromium prometheus")
    assert (record / "policy").read_text() == "policy=101\n"  # asked while apt ran: forbidden
    assert not policy.exists()  # and gone after
    assert (record / "enabled").read_text().split() == ["ssh.service"]
    assert "Selecting previously unselected" in (tmp_path / "apt.log").read_text()


def test_a_failing_apt_says_so_with_the_end_of_its_log(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package nope'\n"
                                     "exit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "SUDO": "", "APT_GET": str(bin_dir / "apt-get"),
           "SYSTEMCTL": str(tmp_path / "no-systemctl"), "POLICY_RC_D": str(tmp_path / "p"),
           "APT_LOG": str(tmp_path / "apt.log")}
    result = subprocess.run([str(REPO / ".ci" / "install-debs.sh"), "nope"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0].startswith("error: apt-get could not install nope")
    assert "E: Unable to locate package nope" in result.stderr
    assert not (tmp_path / "p").exists()
