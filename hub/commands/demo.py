"""`gpufleet demo`: a local multi-cluster fleet, end to end (see hub/devstack/_demo.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hub.common import ConfiguredCommand, UnavailableError

#: the demo hub's default port (hub.devstack.DEMO_HUB_PORT; spelled here so --help loads
#: nothing heavy)
DEMO_HUB_PORT = 19090


@click.command(cls=ConfiguredCommand)
@click.option("--clusters", type=click.IntRange(2, 20), default=3, show_default=True,
              help="Simulated clusters, each with its own Prometheus agent.")
@click.option("--nodes", type=click.IntRange(1, 32), default=4, show_default=True,
              help="GPU nodes per cluster, each running gpufleet's simulated exporter.")
@click.option("--gpus-per-node", type=click.IntRange(1, 16), default=8, show_default=True)
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("gpufleet-demo"), show_default=True,
              help="Where the hub data, inventory database, node lists and report go "
                   "(emptied first if a previous demo made it).")
@click.option("--acm-profile", is_flag=True,
              help="Make the hub behave like ACM Observability's (scaled down): sparse pushes "
                   "without staleness markers, a look-back of twice the push interval, "
                   "clusterID on every series.")
@click.option("--hub-port", type=click.IntRange(0, 65535), default=DEMO_HUB_PORT, show_default=True,
              help="Loopback port of the demo's hub Prometheus, the same on every run so the "
                   "commands it suggests reach the next `demo --keep-running`; 0 picks a "
                   "free one, as does a taken default (another demo running). "
                   "GPUFLEET_HUB_PORT sets it too.")
@click.option("--keep-running", is_flag=True,
              help="Leave the fleet running at the end so you can try the PromQL; it keeps "
                   "syncing and collecting usage as `serve` does. Ctrl-C stops.")
@click.pass_context
def demo(ctx: click.Context, clusters: int, nodes: int, gpus_per_node: int, workdir: Path,
         keep_running: bool, acm_profile: bool, hub_port: int, **_: Any) -> None:
    """Run a local multi-cluster GPU fleet end to end, on loopback.

    Starts a hub Prometheus with the remote-write receiver, one Prometheus agent per cluster
    and gpufleet's exporter (simulated NVIDIA and AMD GPUs, one MIG node) per node; then
    runs sync, usage (GPU-hours of the last hour on the demo's one bucket grid, idle GPUs),
    reconcile (against node lists with one deliberate mismatch) and report. One
    cluster goes silent partway, so the report shows a stale cluster. Every process it
    starts is stopped at the end or on Ctrl-C.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from hub import devstack
    from hub.common import console as make_console

    g = devstack.gpufleet_command()
    console = make_console(stderr=True)
    bars: dict[str, Any] = {}
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        console=console, transient=True,
                        disable=not sys.stderr.isatty())  # silent when piped

    def say(text: str) -> None:
        console.print(f"[bold]>[/bold] {text}")

    def step(what: str, done: int, total: int) -> None:
        if what not in bars:
            bars[what] = progress.add_task(what, total=total)
        progress.update(bars[what], completed=done, total=total)

    try:
        with progress:
            result = devstack.run(clusters=clusters, nodes=nodes, gpus_per_node=gpus_per_node,
                              workdir=workdir, say=say, progress=step, keep_running=keep_running,
                              acm_profile=acm_profile, hub_port=hub_port,
                              port_chosen=ctx.get_parameter_source("hub_port")
                              is not click.core.ParameterSource.DEFAULT,
                              try_next=lambda url: query_lines(g, url))
    except TimeoutError as exc:
        raise UnavailableError(f"demo: {exc}") from None
    except FileNotFoundError as exc:
        raise UnavailableError(f"demo: {exc}") from None
    db = result.db_url
    click.echo("")
    click.echo(f"Inventory database  {db}")
    click.echo(f"HTML report         {result.report}")
    if result.freshness_s is not None:
        click.echo(f"End-to-end freshness {result.freshness_s:.1f}s (a change on a GPU until "
                   "the inventory shows it)")
    click.echo(f"Whole run           {result.elapsed_s:.0f}s")
    click.echo("")
    click.echo("Try next (in any shell):")
    if g != "gpufleet" and (Path(g).parent / "activate").is_file():
        click.echo(f"  . {Path(g).parent / 'activate'}   # puts gpufleet on PATH; or type it "
                   "in full, as below")
    click.echo(f"  {g} inventory clusters --db {db}")
    click.echo(f"  {g} inventory gpus --db {db} --cluster {result.clusters[0]['cluster']}")
    for title, args in devstack.demo_usage_commands(db)[:2]:
        click.echo(f"  {g} {' '.join(args)}   # {title}")
    if result.shared_gpu:
        click.echo(f"  {g} inventory gpu {result.shared_gpu} --db {db}   # the time-sliced "
                   "GPU: two pods at once, each charged its share")
    click.echo(f"  {g} {' '.join(devstack.report_args(db))} -o markdown   # the demo's "
               "report rules")
    hub_port = result.hub_port  # 0 when the default port was taken and a free one served
    again = "" if hub_port == DEMO_HUB_PORT else f" --hub-port {hub_port}"
    if hub_port:
        click.echo(f"The demo's hub ({result.hub_url}) stopped with it; "
                   f"`{g} demo --keep-running{again}` serves it at the same address, then:")
    else:
        click.echo(f"The demo's hub stopped with it; `{g} demo --keep-running` serves a new "
                   "one and prints its address (--hub-port keeps one address), then:")
    for line in query_lines(g, result.hub_url if hub_port else "<the hub it prints>"):
        click.echo(f"  {line}")
    sys.stdout.flush()


def query_lines(g: str, hub_url: str) -> list[str]:
    """PromQL to try against a running demo hub."""
    return [f"{g} query --preset gpus-per-cluster --hub-url {hub_url}",
            f"{g} query --preset gpus-per-cluster --range 5m --step 30s --hub-url {hub_url}"]
