"""Where gpufleet's Jinja2 templates live, for every part that renders (manifests, report, page).

In a checkout they sit at the repository top (templates/, policies/); a wheel bundles them
under hub/_bundled/ (see pyproject.toml), so both places are tried.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from hub.common._errors import UnavailableError


def template_roots() -> tuple[Path, Path]:
    """(templates, policies) directories: bundled in a wheel, at the repo top in a checkout."""
    package = Path(__file__).resolve().parents[1]  # hub/
    for base in (package / "_bundled", package.parent):
        templates, policies = base / "templates", base / "policies"
        if (templates / "spoke").is_dir() and policies.is_dir():
            return templates, policies
    raise UnavailableError(f"gpufleet templates not found next to {package} (broken installation?)")


@functools.cache
def html_environment() -> Any:  # -> jinja2.Environment (Jinja2 imported here: spoke never is)
    """The Jinja2 environment of gpufleet's HTML (templates/report): the report file and the
    service's live page share its layout and tables. Autoescaped, so a hostile cluster or pod
    name is text, never markup; strict, so a missing value fails a test, not a user.

    One per process: an environment keeps its compiled templates, and a new one per page
    compiled three templates for every page the service served (about 25 ms each time).
    Nothing changes it after it is made; rendering from it is thread-safe."""
    import jinja2

    from hub.common._numbers import counted, counts_line, for_people

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_roots()[0] / "report")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # one rounding and one pluralisation on every page (report file and live page alike)
    env.filters.update(people=for_people, counted=counted, counts_line=counts_line)
    return env
