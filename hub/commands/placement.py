"""`placement scores` and `placement apply`: ACM AddOnPlacementScores from the inventory, so
an ACM Placement can prefer the clusters where GPUs are free, healthy and on one node."""

from __future__ import annotations

from typing import Any

import click
import yaml

from hub import inventory as inv
from hub import usage as answers
from hub.commands.core import database, require_schema
from hub.commands.usage import idle_options
from hub.common import (
    DURATION,
    ConfiguredCommand,
    ConfiguredGroup,
    InputError,
    ServeOptions,
    db_option,
    emit,
    env,
    format_duration,
    option,
    output_option,
    to_json,
)

APPLY_COLUMNS = ["kind", "namespace", "name", "action"]


@click.group(cls=ConfiguredGroup)
def placement() -> None:
    """ACM placement scores (AddOnPlacementScore, one per managed cluster) from the inventory.

    \b
    gpuFree            healthy free GPUs, every model (GPU-equivalents): -100 at 0,
                       100 at --full-at
    gpuFreeNode        the largest free block of whole GPUs on one node: 100 at 8
    gpuReclaimable     allocated GPUs idle by the idle rule (`idle`), scaled as gpuFree
    gpuFree-<family>   healthy free GPUs of one model family (gpuFree-h100), as gpuFree
    Free is what `gpufleet capacity` calls free. See docs/operations.md for a Placement that
    prefers gpuFreeNode.
    """


def _score_options(func: Any) -> Any:
    func = idle_options(func)
    func = click.option(
        "--valid-for", type=DURATION, default=format_duration(answers.VALID_FOR_S),
        show_default=True, metavar="DURATION", envvar=env("valid-for"),
        help="status.validUntil this far ahead (a few sync intervals): a Placement ignores "
             "scores gpufleet stopped refreshing.")(func)
    return option(ServeOptions, "full_at",
                  help="Free GPUs that score 100 in gpuFree, gpuReclaimable and "
                       "gpuFree-<family>.")(func)


def _objects(db: str | None, full_at: float, valid_for: float, idle_threshold: float,
             idle_for: float) -> list[dict[str, Any]]:
    if valid_for <= 0:
        raise InputError("--valid-for must be greater than 0")
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            return answers.placement_scores(conn, now=inv.now_utc(), full_at=full_at,
                                            valid_for=valid_for,
                                            idle_threshold=idle_threshold, idle_for=idle_for)


@placement.command("scores", cls=ConfiguredCommand)
@_score_options
@db_option
@output_option("yaml", "json", default="yaml")
def scores(full_at: float, valid_for: float, idle_threshold: float, idle_for: float,
           db: str | None, output: str, **_: Any) -> None:
    """Print one AddOnPlacementScore per cluster (cluster.open-cluster-management.io/v1alpha1,
    in the cluster's namespace on the hub; the scores are its status)."""
    objects = _objects(db, full_at, valid_for, idle_threshold, idle_for)
    if output == "json":
        click.echo(to_json(objects))
    else:
        click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


@placement.command("apply", cls=ConfiguredCommand)
@_score_options
@click.option("--force-conflicts", is_flag=True,
              help="Take over fields another field manager set on a score object.")
@click.option("--context", envvar=env("context"), metavar="CTX",
              help="kubeconfig context of the ACM hub (default: current context).")
@click.option("--kubeconfig", envvar=env("kubeconfig"), metavar="FILE",
              help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
@db_option
@output_option("table", "json")
def apply(full_at: float, valid_for: float, idle_threshold: float, idle_for: float,
          force_conflicts: bool, context: str | None, kubeconfig: str | None,
          db: str | None, output: str, **_: Any) -> None:
    """Write the scores to the ACM hub: server-side apply as field manager gpufleet, the
    scores through the status subresource. A cluster without a namespace on the hub (not a
    managed cluster) is skipped. action: created, configured, unchanged or skipped."""
    from hub import kube, onboard

    objects = _objects(db, full_at, valid_for, idle_threshold, idle_for)
    api = kube.api_client(kubeconfig, context)
    with api:
        rows = onboard.apply_scores(api, objects, force_conflicts=force_conflicts)
    emit(rows, APPLY_COLUMNS, output)
