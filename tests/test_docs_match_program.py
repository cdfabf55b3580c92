"""Every command, option, alert and gpufleet metric the docs and README name exists.

The program's side is read from the program itself, never from a list kept here: the click
tree of `gpufleet` (so commands and options other engineers add are known at once), the rules
`gpufleet alerts render` writes, and the metric families the hub service's and the exporter's
registries expose. A doc that names something the program lacks fails this test.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import click
import pytest
import yaml
from prometheus_client import generate_latest

from hub.cli import cli
from hub.inventory._writer import apply_observations
from hub.service._scheduler import Jobs, build_service
from spoke._exporter import Exporter
from spoke._sim import SimBackend
from tests.support.clirun import gpufleet

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


# -- the program's side ------------------------------------------------------------------------
def commands() -> dict[tuple[str, ...], click.Command]:
    """Every command path of the click tree, the root as ()."""
    out: dict[tuple[str, ...], click.Command] = {}

    def walk(path: tuple[str, ...], cmd: click.Command) -> None:
        out[path] = cmd
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    walk((*path, name), sub)

    walk((), cli)
    return out


def options(cmd: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in cmd.params:
        if isinstance(param, click.Option):
            names |= set(param.opts) | set(param.secondary_opts)
    return names


def alert_names(tmp_path: Path) -> set[str]:
    result = gpufleet("alerts", "render", "--out", str(tmp_path / "alerts"))
    assert result.exit_code == 0, result.output
    names: set[str] = set()
    for path in (tmp_path / "alerts").glob("*.rules.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {rule["alert"] for rule in group["rules"] if "alert" in rule}
    assert names
    return names


def metric_names(tmp_path: Path) -> set[str]:
    """Sample names of the hub service's /metrics (the app's own answer over an
    inventory with one GPU) and of the exporter's /metrics."""
    from hub import inventory as inv
    from hub.inventory._normalize import Observation
    from tests.support.asgi import AppClient

    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    with engine.begin() as conn:
        apply_observations(conn, [Observation("east", "a", "GPU-1", "nvidia")],
                               inv.now_utc())
    from hub.service import TlsFiles
    from tests.test_api_access import make_cert

    make_cert(tmp_path, "metrics")  # with TLS: the certificate's expiry is a metric too
    service = build_service(Jobs(sync=lambda: None), every=3600.0,  # type: ignore[arg-type]
                            engine=engine, process_metrics=False,
                            tls=TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key"))
    try:
        status, raw = AppClient(service.app).handle("/metrics")
    finally:
        service.server.close()
        engine.dispose()
    assert status == 200
    backend = SimBackend(gpus=1)
    backend.open()
    held: list[dict] = [{}]

    class Kubelet:  # a pod that takes the GPU after the exporter's first pass: its edges
        def devices(self) -> dict:
            return held[-1]

    from spoke._edges import Edges

    exporter = Exporter(backend, hostname="node-a", pods=Kubelet(), edges=Edges())
    exporter.collect_once()
    held.append({r.uuid: [("ns", "pod", "c")] for r in backend.collect().readings})
    exporter.collect_once()
    held.append({})
    exporter.collect_once()
    text = raw.text + generate_latest(exporter.registry).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    return {n for n in names if n.startswith("gpufleet_")}


# -- the docs' side ------------------------------------------------------------------------------
def doc_lines() -> list[tuple[str, int, list[str]]]:
    """(file, line number, code on that line): a fenced block's line whole, else its
    `backtick` spans. Prose ("gpufleet gives teams...") is not a command."""
    out = []
    for path in DOCS:
        fenced = False
        # a shell line continued with a backslash is one command
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        for no, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            code = [line] if fenced else SPAN.findall(line)
            out.append((path.relative_to(ROOT).as_posix(), no, code))
    return out


def raw_lines() -> list[tuple[str, int, str]]:
    return [(path.relative_to(ROOT).as_posix(), no, line) for path in DOCS
            for no, line in enumerate(path.read_text().splitlines(), 1)]


INVOCATION = re.compile(r"\bgpufleet((?:\s+(?:[a-z][a-z0-9-]*(?:[|/][a-z][a-z0-9-]*)*|/))+)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
SPAN = re.compile(r"`([^`]+)`")
FOREIGN = ("promtool", "metric-labels", "-n ", "prometheus", "kubectl", "oc ", "helm", "pip",
           "chromium", "make ", "python", "dcgm", "alembic", "curl", "pg_ctl", "initdb", "ruff",
           "pytest", "checkov", "apt-get")


def resolve(words: list[str], tree: dict[tuple[str, ...], click.Command]
            ) -> tuple[list[tuple[str, ...]], str | None]:
    """The command paths a doc's `gpufleet a b|c ...` names, or the first unknown word."""
    paths: list[tuple[str, ...]] = [()]
    for word in words:
        if word == "/":
            continue
        if not isinstance(tree[paths[0]], click.Group):
            break  # an argument (EXPR, NAME) of a leaf command
        alternatives = re.split(r"[|/]", word)
        nxt = []
        for path in paths:
            for alt in alternatives:
                if (*path, alt) not in tree:
                    return paths, " ".join((*path, alt))
                nxt.append((*path, alt))
        paths = nxt
    return paths, None


def test_every_command_and_option_the_docs_name_exists():
    tree = commands()
    every_option = set().union(*(options(c) for c in tree.values()))
    problems = []
    for where, no, code in doc_lines():
        for part in code:
            for match in INVOCATION.finditer(part):
                if any(f in part[:match.start()] for f in FOREIGN):
                    continue  # `kubectl -n gpufleet create ...`: a namespace, not us
                paths, unknown = resolve(match.group(1).split(), tree)
                if unknown:
                    problems.append(f"{where}:{no}: no command `gpufleet {unknown}`")
                    continue
                rest = re.split(r"\s#\s|\s{3,}", part[match.end():])[0]  # to a comment/gap
                for path in paths:
                    allowed = options(tree[path]) | options(cli)
                    for opt in OPTION.findall(rest):
                        if opt not in allowed:
                            problems.append(f"{where}:{no}: `gpufleet {' '.join(path)}` has "
                                            f"no option {opt}")
            if "gpufleet" in part or any(f in part for f in FOREIGN):
                continue
            for opt in OPTION.findall(part):
                if opt not in every_option:
                    problems.append(f"{where}:{no}: no gpufleet command has option {opt}")
    assert not problems, "\n".join(problems)


def test_every_alert_the_docs_name_exists(tmp_path):
    rendered = alert_names(tmp_path)
    named = {(where, no, m) for where, no, line in raw_lines()
             for m in re.findall(r"\bGpu_?[Ff]leet[A-Z]\w+", line)}
    missing = [f"{where}:{no}: {name}" for where, no, name in sorted(named)
               if name not in rendered]
    assert not missing, "alerts `gpufleet alerts render` does not write:\n" + "\n".join(missing)


def test_every_gpufleet_metric_the_docs_name_exists(tmp_path):
    exposed = metric_names(tmp_path)
    bases = exposed | {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in exposed}
    missing = []
    for where, no, line in raw_lines():
        for name in re.findall(r"\bgpufleet_[a-z_]+[a-z]", line):
            if name not in bases:
                missing.append(f"{where}:{no}: {name}")
    assert not missing, "metrics no gpufleet /metrics exposes:\n" + "\n".join(missing)


@pytest.mark.parametrize("bad", [
    "Run `gpufleet inventory sync-runs --cluster east`.",
    "Alert `GpufleetClusterStale`.",
    "Watch `gpufleet_sync_last_failure_seconds`.",
    "Run `gpufleet invntory gpus`.",
])
def test_the_checks_catch_a_drifted_doc(bad, tmp_path, monkeypatch):
    doc = tmp_path / "drift.md"
    doc.write_text(bad + "\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["DOCS"]), "DOCS", [doc])
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    checks = [test_every_command_and_option_the_docs_name_exists,
              lambda: test_every_alert_the_docs_name_exists(tmp_path),
              lambda: test_every_gpufleet_metric_the_docs_name_exists(tmp_path)]
    failed = 0
    for check in checks:
        try:
            check()
        except AssertionError:
            failed += 1
    assert failed == 1


def test_the_file_trees_the_docs_show_are_what_render_writes(tmp_path):
    """A fenced tree `DIR/` right after a fenced `gpufleet ... render ... --out DIR` block
    lists exactly the files that command writes (dotfiles aside)."""
    checked = 0
    for path in DOCS:
        blocks = re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), re.S)
        for command, tree in itertools.pairwise(blocks):
            command = re.sub(r"\\\n\s*", " ", command).strip()
            head = tree.strip().splitlines()[0] if tree.strip() else ""
            out = re.search(r"--out (\S+)", command)
            if not (command.startswith("gpufleet ") and out and head == out.group(1) + "/"):
                continue
            args = re.sub(r"\[[^\]]*\]\.*", "", command).split()[1:]
            args[args.index("--out") + 1] = str(tmp_path / str(checked))
            result = gpufleet(*args)
            assert result.exit_code == 0, (path.name, command, result.output)
            listed = {line.split()[0] for line in tree.strip().splitlines()[1:]
                      if "with --" not in line  # files of another flag's variant
                      and line.split() and "." in line.split()[0]}  # not a wrapped line
            root = tmp_path / str(checked)
            written = {p.relative_to(root).as_posix() for p in root.rglob("*")
                       if p.is_file() and not p.name.startswith(".")}
            assert listed == written, f"{path.name}: `{command}` writes {sorted(written)}"
            checked += 1
    assert checked  # the onboarding guide's policy tree at least


def test_the_readme_leads_to_every_question_a_user_brings():
    """Usage, idle, capacity, a GPU's history, events and showback: each one example command
    in the README, and the README links the page that explains them."""
    readme = (ROOT / "README.md").read_text()
    assert "(docs/usage.md)" in readme
    examples = [line for block in re.findall(r"```sh\n(.*?)```", readme, re.S)
                for line in block.splitlines()]
    for question in ("gpufleet usage --since", "gpufleet idle", "gpufleet capacity",
                     "gpufleet inventory gpu ", "gpufleet inventory events",
                     "gpufleet usage collect", "--prices"):
        assert any(question in line for line in examples), question


def test_shell_steps_create_a_namespace_before_they_put_anything_in_it():
    """A reader pastes the blocks in order: `kubectl -n NS create ...` fails before NS exists
    (created by `kubectl create namespace NS` or a rendered namespace.yaml, whose namespace
    is gpufleet unless --namespace says otherwise)."""
    problems = []
    for path in DOCS:
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            made: set[str] = set()
            for line in block.splitlines():
                if m := re.search(r"kubectl (?:create namespace|create ns) (\S+)", line):
                    made.add(m.group(1))
                elif re.search(r"kubectl apply -f \S*namespace\.yaml", line):
                    made.add("gpufleet")
                elif ((m := re.search(r"kubectl -n (\S+) create (?:secret|configmap)", line))
                      and m.group(1) not in made):
                    problems.append(f"{path.name}: {line.strip()[:80]}")
    assert problems == [], problems
