"""Small helpers every part shares, the spoke exporter included: errors and exit codes,
durations, SIGTERM handling, the click base, the HTTP server base, shared options and output,
and the inline-SVG charts of the report and the live page.
Nothing here imports another hub package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hub.common._clibase import CONFIG_ENV, ConfiguredCommand, ConfiguredGroup, load_config
from hub.common._dcgm_names import DCGM_RENAMES, DcgmRename
from hub.common._dcgm_names import DRIVER_LABELS as DCGM_DRIVER_LABELS
from hub.common._dcgm_names import FB_CAPACITY as DCGM_FB_CAPACITY
from hub.common._durations import (
    DURATION,
    format_duration,
    human_duration,
    parse_duration,
)
from hub.common._errors import (
    EXIT_FINDINGS,
    GpufleetError,
    InputError,
    UnavailableError,
    shorten,
)
from hub.common._lazy import lazy_attributes
from hub.common._numbers import counted, counts_line, for_people, json_number
from hub.common._options import (
    PERCENT,
    db_option,
    env,
    hub_options,
)
from hub.common._output import (
    NO_WRAP,
    console,
    csv_cell,
    emit,
    frame_to_csv,
    iso,
    output_option,
    progress,
    to_json,
    to_table,
)
from hub.common._redact import (
    REDACTED,
    RedactingFilter,
    redact,
    redact_urls,
    register_secret,
)
from hub.common._signals import (
    on_sigterm,
)
from hub.common._templates import html_environment, template_roots
from hub.common._textfiles import (
    MAX_JSON_BYTES,
    brief_repr,
    check_document,
    load_yaml,
    parse_json,
    parse_yaml,
    read_text,
    refuse_nul,
)

__all__ = [
    "CHECKS",
    "CONFIG_ENV",
    "DCGM_DRIVER_LABELS",
    "DCGM_FB_CAPACITY",
    "DCGM_RENAMES",
    "DURATION",
    "EXIT_FINDINGS",
    "IDLE",
    "LEDGER",
    "MAX_JSON_BYTES",
    "NO_WRAP",
    "PERCENT",
    "QUERY_CONCURRENCY",
    "REDACTED",
    "REPORT",
    "SHARD_SIZE",
    "SYNC",
    "AccessSettings",
    "BackgroundHTTPServer",
    "CheckSettings",
    "CollectSettings",
    "ConfiguredCommand",
    "ConfiguredGroup",
    "DcgmRename",
    "GpufleetError",
    "IdleSettings",
    "InputError",
    "LedgerSettings",
    "QuietHangups",
    "RedactingFilter",
    "ReportSettings",
    "ServeOptions",
    "Settings",
    "SyncSettings",
    "TlsSettings",
    "UnavailableError",
    "brief_repr",
    "capacity_chart",
    "check_document",
    "check_full_at",
    "cluster_label_option",
    "console",
    "counted",
    "counts_line",
    "csv_cell",
    "db_option",
    "emit",
    "env",
    "for_people",
    "format_duration",
    "frame_to_csv",
    "gpu_hours_by_day_chart",
    "html_environment",
    "hub_options",
    "human_duration",
    "idle_gpu_hours_chart",
    "iso",
    "json_number",
    "lazy_attributes",
    "lemon_threshold_option",
    "load_config",
    "load_yaml",
    "lock_timeout_option",
    "max_age_option",
    "min_charge_option",
    "on_sigterm",
    "option",
    "options_of",
    "output_option",
    "parse_duration",
    "parse_json",
    "parse_listen",
    "parse_yaml",
    "pick",
    "progress",
    "proxy_addresses",
    "push_interval_option",
    "query_concurrency_option",
    "read_text",
    "redact",
    "redact_urls",
    "refuse_nul",
    "register_secret",
    "replaced_within_option",
    "shard_size_option",
    "shorten",
    "stacked_bars",
    "stacked_columns",
    "stale_after_option",
    "stale_clusters_chart",
    "template_roots",
    "time_lines",
    "to_json",
    "to_table",
    "utilisation_chart",
    "window_option",
]


if TYPE_CHECKING:
    from hub.common._charts import (
        capacity_chart,
        gpu_hours_by_day_chart,
        idle_gpu_hours_chart,
        stacked_bars,
        stacked_columns,
        stale_clusters_chart,
        time_lines,
        utilisation_chart,
    )
    from hub.common._httpserve import BackgroundHTTPServer, QuietHangups, parse_listen
    from hub.common._settings import (
        CHECKS,
        IDLE,
        LEDGER,
        QUERY_CONCURRENCY,
        REPORT,
        SHARD_SIZE,
        SYNC,
        AccessSettings,
        CheckSettings,
        CollectSettings,
        IdleSettings,
        LedgerSettings,
        ReportSettings,
        ServeOptions,
        Settings,
        SyncSettings,
        TlsSettings,
        check_full_at,
        cluster_label_option,
        lemon_threshold_option,
        lock_timeout_option,
        max_age_option,
        min_charge_option,
        option,
        options_of,
        pick,
        proxy_addresses,
        push_interval_option,
        query_concurrency_option,
        replaced_within_option,
        shard_size_option,
        stale_after_option,
        window_option,
    )

#: the settings' models and the options made from them (hub.common._settings) load on first
#: use: they bring pydantic, which the spoke exporter never needs
_SETTINGS = ("CHECKS", "IDLE", "IdleSettings", "REPORT", "ReportSettings", "LEDGER",
             "QUERY_CONCURRENCY", "SHARD_SIZE", "SYNC", "AccessSettings", "CheckSettings",
             "CollectSettings", "LedgerSettings", "ServeOptions", "Settings", "SyncSettings",
             "TlsSettings", "check_full_at", "cluster_label_option", "lemon_threshold_option",
             "lock_timeout_option", "max_age_option", "min_charge_option", "option", "options_of",
             "pick", "proxy_addresses", "push_interval_option", "query_concurrency_option",
             "replaced_within_option", "shard_size_option", "stale_after_option", "window_option")


#: The HTTP server base (http.server, socketserver) loads on first use: only `serve`, the
#: exporter and the test stacks need it, not every command's start. The charts (the report's
#: and the page's inline SVG) likewise: the exporter on a GPU node never draws one.
__getattr__ = lazy_attributes(__name__, {"BackgroundHTTPServer": "_httpserve",
                                         "parse_listen": "_httpserve",
                                         "QuietHangups": "_httpserve",
                                         "capacity_chart": "_charts",
                                         "gpu_hours_by_day_chart": "_charts",
                                         "idle_gpu_hours_chart": "_charts",
                                         "stacked_bars": "_charts",
                                         "stacked_columns": "_charts",
                                         "stale_clusters_chart": "_charts",
                                         "time_lines": "_charts",
                                         "utilisation_chart": "_charts",
                                         **dict.fromkeys(_SETTINGS, "_settings"),
})
