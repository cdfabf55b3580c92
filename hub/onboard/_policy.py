"""ACM policies that install a spoke's manifests on every cluster a Placement selects.

Jinja2 and ACM hub templates both use ``{{ }}``. ACM expressions such as
``{{hub .ManagedClusterName hub}}`` never appear in template source, where Jinja2 would evaluate
them: :func:`acm_hub` builds them in Python and they enter the templates as ordinary values,
which Jinja2 copies verbatim. The tests check that the rendered policy contains them literally.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from hub.common import InputError
from hub.onboard._render import (
    _choice,
    _kustomization,
    _labels,
    _render,
    dns_label,
    label_pair,
)
from hub.onboard._spoke import SpokeValues, spoke_manifests, spoke_values

REMEDIATIONS = ("inform", "enforce")
DEFAULT_POLICY_NAMESPACE = "gpufleet-policies"
DEFAULT_PLACEMENT_LABEL = ("gpufleet.io/onboard", "true")
#: Every Placement also requires this ManagedCluster label to equal the policy's vendor set
#: ("nvidia", "amd", "nvidia-amd"). A label has one value per cluster, so policies of different
#: vendor sets select disjoint clusters and never manage the same spoke objects (the agent,
#: its config, the namespace) with different contents, whatever --placement-label says.
VENDOR_LABEL = "gpufleet.io/gpu-vendor"


@dataclass(frozen=True)
class PolicyValues:
    """An ACM Policy that installs a spoke's manifests on every cluster its Placement selects."""

    spoke: SpokeValues
    namespace: str = DEFAULT_POLICY_NAMESPACE
    placement_labels: tuple[tuple[str, str], ...] = (DEFAULT_PLACEMENT_LABEL,)
    remediation: str = "inform"
    cluster_set: str = "default"
    name: str = ""  # default: gpufleet-onboard-<vendor>

    @property
    def policy_name(self) -> str:
        return self.name or f"gpufleet-onboard-{self.spoke.vendor}"


def acm_hub(expression: str) -> str:
    """An ACM hub template (``{{hub EXPR hub}}``) as a plain string value.

    The ACM policy framework resolves it on the hub, per managed cluster, before the policy
    reaches the cluster. Built here, never written in a Jinja2 template, so Jinja2 only copies it.
    """
    return "{{hub " + expression + " hub}}"


def acm_from_secret(namespace: str, name: str, key: str) -> str:
    """Hub template reading one key of a hub-side Secret (already base64, as Secret.data wants).

    Hub templates may only read objects in the policy's own namespace, so the Secret lives there.
    """
    return acm_hub(f'fromSecret "{namespace}" "{name}" "{key}"')



def policy_values(
    spoke: SpokeValues,
    *,
    namespace: str | None = DEFAULT_POLICY_NAMESPACE,
    placement_labels: Iterable[str] = (),
    remediation: str | None = "inform",
    cluster_set: str | None = "default",
) -> PolicyValues:
    """Check the policy's own options; the spoke values must come from :func:`policy_spoke`."""
    namespace_ = dns_label(namespace, "policy namespace")
    labels = tuple(sorted(dict(label_pair(s, "placement label") for s in placement_labels).items()))
    if any(key == VENDOR_LABEL for key, _ in labels):
        raise InputError(f"placement label {VENDOR_LABEL} is set from --vendor: leave it out")
    values = PolicyValues(
        spoke=spoke,
        namespace=namespace_,
        placement_labels=labels or (DEFAULT_PLACEMENT_LABEL,),
        remediation=_choice(remediation, REMEDIATIONS, "remediation action"),
        cluster_set=dns_label(cluster_set, "cluster set"),
    )
    # ACM copies a policy into each cluster namespace as "<namespace>.<name>", which must stay
    # a valid label value: namespace and name together may have at most 62 characters.
    if len(values.namespace) + len(values.policy_name) > 62:
        raise InputError(f"policy namespace {namespace_!r} is too long: ACM needs the namespace "
                         "and the policy name to fit in 62 characters together")
    return values


def policy_spoke(policy_namespace: str | None = DEFAULT_POLICY_NAMESPACE,
                 **options: Any) -> SpokeValues:
    """Spoke values for a policy: per-cluster values become ACM hub templates.

    One policy serves every selected cluster, so the cluster name comes from
    ``.ManagedClusterName`` and the remote-write credentials from a hub-side Secret in the
    policy namespace, resolved by ACM on the hub; no secret value is ever in the rendered files.
    """
    ns = dns_label(policy_namespace, "policy namespace")
    values = spoke_values(cluster=acm_hub(".ManagedClusterName"), cluster_is_template=True,
                          **options)
    if values.mode != "remote-write":
        return values
    data = tuple((key, acm_from_secret(ns, values.remote_write_secret, key))
                 for key in ("ca.crt", "token"))
    return replace(values, secret_data=data)



def render_policy(values: PolicyValues) -> dict[str, str]:
    """All files of ``gpufleet policy render``: the hub-side ACM objects, in apply order."""
    name = values.policy_name
    objects = [{"path": path, "text": text} for path, text in spoke_manifests(values.spoke).items()]
    context = {
        "name": name,
        "namespace": values.namespace,
        "cluster_set": values.cluster_set,
        "remediation": values.remediation,
        "placement_labels": {**dict(values.placement_labels),
                             VENDOR_LABEL: values.spoke.vendor},
        "objects": objects,
        "spoke": values.spoke,
        "labels": lambda component: _labels(name, component, name),
        # Objects every gpufleet policy in the namespace writes (the namespace, the cluster-set
        # binding) must be identical whichever vendor's policy wrote them, or two rendered
        # policies applied side by side would keep rewriting each other's labels.
        "shared_labels": _labels("gpufleet-policies", "policy", values.namespace),
    }
    files = {
        "namespace.yaml": _render("templates/common/namespace.yaml.j2", ns_name=values.namespace,
                                  ns_labels=context["shared_labels"]),
        "managedclustersetbinding.yaml": _render("policies/managedclustersetbinding.yaml.j2",
                                                 **context),
        "placement.yaml": _render("policies/placement.yaml.j2", **context),
        "policy.yaml": _render("policies/policy.yaml.j2", **context),
        "placementbinding.yaml": _render("policies/placementbinding.yaml.j2", **context),
    }
    files["kustomization.yaml"] = _kustomization(files)
    return files
