"""Output that is not a terminal (a pipe, `| less`, a log file, CI) keeps whole lines: no
table hard-wrapped or turned into records for want of 80 columns, no message cut."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hub.common import NO_WRAP, console, to_table
from tests.support.httpstub import StubServer, json_response

ROOT = Path(__file__).resolve().parents[1]
LABELS = {f"label_{i:02d}": f"value-{i:02d}-" + "x" * 12 for i in range(12)}


def test_a_wide_query_table_piped_stays_one_line_per_row():
    answer = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {**LABELS, "row": str(n)}, "value": [1700000000, str(n)]} for n in range(3)]}}
    server = StubServer(lambda req: json_response(200, answer))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    try:
        # a real process whose stdout is a pipe, as in `gpufleet query ... | less`
        proc = subprocess.run([sys.executable, "-m", "hub", "query", "up", "--hub-url",
                               server.url], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4, proc.stdout  # the header and three rows: nothing wrapped
    assert all(len(line) > 300 for line in lines)
    assert all(value in lines[1] for value in LABELS.values())


def test_columns_still_sets_the_width_when_asked():
    rows = [{**LABELS, "row": "0"}]
    assert len(to_table(rows, list(rows[0]), width=NO_WRAP).splitlines()) == 2
    assert len(to_table(rows, list(rows[0]), width=80).splitlines()) == len(rows[0])


def test_progress_messages_are_not_cut_when_stderr_is_not_a_terminal(capsys):
    message = "started " + " ".join(f"cluster-{i:03d}" for i in range(40))
    console(stderr=True).print(message)
    err = capsys.readouterr().err
    assert err == message + "\n"
