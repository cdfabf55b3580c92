"""A spoke collected the way ACM does it, built from what gpufleet renders, on loopback.

Two federating Prometheus agents in front of one spoke Prometheus (a full server that scrapes
the exporters and kube-state-metrics and evaluates rules, as OpenShift's platform monitoring
does):

* MCOA: the agent's scrape jobs are the rendered ScrapeConfig objects as the addon's
  PrometheusAgent runs them (``/federate`` with their ``match[]``, their metricRelabelings),
  and the rendered PrometheusRule is evaluated in the spoke's Prometheus;
* legacy: the metrics-collector federates what the allowlist ConfigMap names (``names``,
  ``matches``) plus ACM's default allowlist's node capacity series, and evaluates the
  allowlist's recording rules itself, pushing their results under the record names. The
  collector's rule evaluation is played by a rule in the spoke's Prometheus recorded under
  ``acm_legacy:<name>`` and renamed back on federation: the same series reach the hub.
"""

from __future__ import annotations

from typing import Any

import yaml

from hub import onboard, store

#: ACM's own default allowlist carries these (gpufleet's allowlist leaves them out)
LEGACY_DEFAULTS = ['{__name__="kube_node_status_capacity"}',
                   '{__name__="kube_node_status_allocatable"}']
_LEGACY_PREFIX = "acm_legacy:"
_SNAKE = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A ScrapeConfig metricRelabeling (prometheus-operator's camelCase) as Prometheus'
    metric_relabel_configs entry."""
    return {_SNAKE.get(key, key): value for key, value in rule.items()}


def rendered_hub(collection: str) -> dict[str, dict[str, Any]]:
    values = onboard.spoke_values(cluster="east", vendor="nvidia,amd", mode="acm",
                                  acm_collection=collection)
    return {path.removeprefix("hub/"): yaml.safe_load(text)
            for path, text in onboard.render_spoke(values).items()
            if path.startswith("hub/") and not path.endswith("kustomization.yaml")}


def _job(name: str, spoke: str, selectors: list[str],
         relabelings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"job_name": name, "metrics_path": "/federate", "honor_labels": True,
            "params": {"match[]": selectors}, "static_configs": [{"targets": [spoke]}],
            "metric_relabel_configs": relabelings}


def mcoa_jobs(spoke: str) -> list[dict[str, Any]]:
    """The agent's scrape jobs from the rendered ScrapeConfigs, field for field."""
    jobs = []
    for obj in rendered_hub("mcoa").values():
        if obj["kind"] != "ScrapeConfig":
            continue
        spec = obj["spec"]
        job = _job(spec["jobName"], spoke, spec["params"]["match[]"],
                   [relabel(r) for r in spec.get("metricRelabelings") or []])
        job["metrics_path"] = spec["metricsPath"]
        job["honor_labels"] = spec["honorLabels"]
        jobs.append(job)
    return jobs


def mcoa_rules() -> list[dict[str, Any]]:
    """The rendered PrometheusRule's groups, as the spoke's Prometheus loads them."""
    [rule] = [o for o in rendered_hub("mcoa").values() if o["kind"] == "PrometheusRule"]
    return [{**group, "interval": "1s"} for group in rule["spec"]["groups"]]


def legacy_allowlist() -> dict[str, Any]:
    [config_map] = rendered_hub("legacy").values()
    return yaml.safe_load(next(iter(config_map["data"].values())))


def legacy_jobs(spoke: str) -> list[dict[str, Any]]:
    listed = legacy_allowlist()
    selectors = [*(f'{{__name__="{name}"}}' for name in listed["names"]),
                 *(f"{{{match}}}" for match in listed["matches"]), *LEGACY_DEFAULTS,
                 *(f'{{__name__="{_LEGACY_PREFIX}{r["record"]}"}}'
                   for r in listed["recording_rules"])]
    rename = {"source_labels": ["__name__"], "regex": f"{_LEGACY_PREFIX}(.+)",
              "target_label": "__name__", "replacement": "$1", "action": "replace"}
    return [_job("metrics-collector", spoke, selectors, [rename])]


def legacy_rules() -> list[dict[str, Any]]:
    return [{"name": "acm-legacy-collector", "interval": "1s", "rules": [
        {"record": f"{_LEGACY_PREFIX}{r['record']}", "expr": r["expr"]}
        for r in legacy_allowlist()["recording_rules"]]}]


def spoke_config(targets: dict[str, str], rule_file: str) -> dict[str, Any]:
    """The spoke's own Prometheus: scrapes each target (job -> HOST:PORT), evaluates rules."""
    return {"global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [rule_file],
            "scrape_configs": [{"job_name": job, "honor_labels": True,
                                "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()]}


def agent_config(cluster: str, jobs: list[dict[str, Any]], hub_url: str) -> dict[str, Any]:
    """The federating agent: MCOA's PrometheusAgent or ACM's metrics-collector, pushing with
    the cluster label."""
    return {"global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "external_labels": {"cluster": cluster}},
            "scrape_configs": jobs,
            "remote_write": [{"url": f"{hub_url}/api/v1/write", "queue_config": {
                "batch_send_deadline": "500ms", "min_backoff": "100ms", "max_backoff": "1s"}}]}


def selectors_of(collection: str) -> int:
    """How many match[] selectors a path federates (for the figures a run prints)."""
    jobs = mcoa_jobs("x") if collection == store.MCOA_COLLECTION else legacy_jobs("x")
    return sum(len(j["params"]["match[]"]) for j in jobs)
