"""The one Jinja environment every generated file comes from (batch scripts, node scripts, slurm.conf).

Rules: undefined names are errors (a typo never renders an empty string into a script); no HTML
escaping; the trailing newline is kept; ``{% %}`` blocks leave no blank lines; Jinja comments are
``<#-- … --#>`` so bash's ``${#ARR[@]}`` is not read as one. The ``q`` filter quotes a value for a
POSIX shell (``shlex.quote``): everything rendered into shell goes through it.
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

import jinja2


@functools.lru_cache(maxsize=None)
def environment(directory: Path) -> jinja2.Environment:
    """The environment for the templates in ``directory`` (cached; callers may add filters once)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)), undefined=jinja2.StrictUndefined, autoescape=False,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        comment_start_string="<#--", comment_end_string="--#>",
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


def render(directory: Path, name: str, **context: object) -> str:
    """Render template ``name`` from ``directory`` with ``context``."""
    return environment(Path(directory)).get_template(name).render(**context)
