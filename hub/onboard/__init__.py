"""What a cluster installs to join the fleet and how it is rolled out: spoke manifests, ACM
policies, the hub service's own manifests, and applying policies through ACM. ACM apply/status
load the kubernetes client only when used.
"""

from __future__ import annotations

from hub.common import lazy_attributes, template_roots
from hub.onboard._collection import CHOICES as ACM_COLLECTION_CHOICES
from hub.onboard._collection import Collection, check_choice, collection_of
from hub.onboard._dcgmconfig import (
    configured_name,
    merged,
    needs_reading,
    parse_collectors,
    theirs_to_merge,
)
from hub.onboard._grafana import (
    OBSERVABILITY_NAMESPACE,
    dashboard_panels,
    render_grafana,
)
from hub.onboard._hubservice import (
    DB_SECRET_KEY,
    DEFAULT_CA_KEY,
    DEFAULT_CPU_LIMIT,
    DEFAULT_DB_SECRET,
    DEFAULT_REPLICAS,
    DEFAULT_SCOPE_CLAIM,
    DEFAULT_TOKEN_SECRET,
    SCOPES_KEY,
    TOKEN_KEY,
    TOKENS_KEY,
    cron_schedule,
    hub_service_values,
    render_hub_service,
)
from hub.onboard._policy import (
    DEFAULT_POLICY_NAMESPACE,
    VENDOR_LABEL,
    acm_hub,
    policy_spoke,
    policy_values,
    render_policy,
)
from hub.onboard._render import (
    DEFAULT_EXPORTER_IMAGE,
    DEFAULT_NAMESPACE,
    DNS_LABEL,
    _kustomization,
    dns_label,
    write_tree,
    yaml_quote,
)
from hub.onboard._spoke import (
    DCGM_CONFIGMAP,
    DEFAULT_AGENT_IMAGE,
    DEFAULT_SECRET,
    SpokeValues,
    hub_objects,
    metrics_keep_regex,
    parse_placements,
    render_spoke,
    spoke_manifests,
    spoke_values,
)

#: ACM helpers import the kubernetes client: loaded only when asked for
__getattr__ = lazy_attributes(__name__, dict.fromkeys(
    ("any_noncompliant", "apply_objects", "apply_scores", "load_dir", "policy_status"),
    "_acm"))

__all__ = [
    "ACM_COLLECTION_CHOICES",
    "DB_SECRET_KEY",
    "DCGM_CONFIGMAP",
    "DEFAULT_AGENT_IMAGE",
    "DEFAULT_CA_KEY",
    "DEFAULT_CPU_LIMIT",
    "DEFAULT_DB_SECRET",
    "DEFAULT_EXPORTER_IMAGE",
    "DEFAULT_NAMESPACE",
    "DEFAULT_POLICY_NAMESPACE",
    "DEFAULT_REPLICAS",
    "DEFAULT_SCOPE_CLAIM",
    "DEFAULT_SECRET",
    "DEFAULT_TOKEN_SECRET",
    "DNS_LABEL",
    "OBSERVABILITY_NAMESPACE",
    "SCOPES_KEY",
    "TOKENS_KEY",
    "TOKEN_KEY",
    "VENDOR_LABEL",
    "Collection",
    "SpokeValues",
    "acm_hub",
    "any_noncompliant",
    "apply_objects",
    "apply_scores",
    "check_choice",
    "collection_of",
    "configured_name",
    "cron_schedule",
    "dashboard_panels",
    "dns_label",
    "hub_objects",
    "hub_service_values",
    "load_dir",
    "merged",
    "metrics_keep_regex",
    "needs_reading",
    "parse_collectors",
    "parse_placements",
    "policy_spoke",
    "policy_status",
    "policy_values",
    "render_grafana",
    "render_hub_service",
    "render_policy",
    "render_spoke",
    "spoke_manifests",
    "spoke_values",
    "template_roots",
    "theirs_to_merge",
    "write_tree",
    "yaml_quote",
]


#: the kustomization listing a folder's files (policy render's hub/ folder)
kustomization = _kustomization
