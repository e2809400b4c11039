"""Where this installation of slurm-amoeba came from, and the ``pip install`` line that adds an extra to it.

The project is not on a public package index: a site installs a wheel, a repository URL or a checkout. The
commands' messages name the extra a command needs (``cli/entry.py``, ``launcher/executor.py``) with a line that works
from wherever this installation came from. Standard library only (DESIGN.md, layer ``core/``).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

#: The distribution's name (not on PyPI: it installs from a wheel, a repository URL or a checkout).
DISTRIBUTION = "slurm-amoeba"
#: What an install line names when nothing says where the package came from (docs/operations.md explains it).
SOURCE_PLACEHOLDER = "<the slurm-amoeba wheel or repository URL>"


def install_command(extra: str, direct_url: str | None = None) -> str:
    """The ``pip install`` line that adds ``extra`` to this installation, from where it was installed.

    pip records that source in the distribution's ``direct_url.json`` (PEP 610): a wheel or sdist file, a git
    repository at a commit, or a checkout (editable or not). An installation from a package index records none, and
    the index has the package; a checkout run from its source tree gives its own path.

    Args:
        extra: the pip extra (``daemon``).
        direct_url: the text of ``direct_url.json``; None: read it from the installed distribution.

    Returns:
        e.g. ``pip install 'slurm-amoeba[daemon] @ file:///tmp/slurm_amoeba-0.1.0-py3-none-any.whl'``.
    """
    if direct_url is None:
        # Every copy of the metadata on sys.path: a checkout's own ``*.egg-info`` (left by a build, found first
        # when the checkout is the working directory) records no source; the installed one does.
        found = list(importlib.metadata.distributions(name=DISTRIBUTION))
        if not found:  # a source tree on sys.path, not installed
            tree = Path(__file__).resolve().parents[2]
            if (tree / "pyproject.toml").is_file():
                return f"pip install -e '{tree}[{extra}]'"
            return f"pip install '{DISTRIBUTION}[{extra}] @ {SOURCE_PLACEHOLDER}'"
        recorded = (dist.read_text("direct_url.json") for dist in found)
        direct_url = next((text for text in recorded if text is not None), None)
        if direct_url is None:
            return f"pip install '{DISTRIBUTION}[{extra}]'"  # from a package index (a site's own), which has it
    try:
        record = json.loads(direct_url)
        url = str(record["url"])
    except (ValueError, KeyError, TypeError):
        return f"pip install '{DISTRIBUTION}[{extra}] @ {SOURCE_PLACEHOLDER}'"
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") and vcs.get("commit_id"):
        return f"pip install '{DISTRIBUTION}[{extra}] @ {vcs['vcs']}+{url}@{vcs['commit_id']}'"
    directory = record.get("dir_info")
    if isinstance(directory, dict) and directory.get("editable") and url.startswith("file://"):
        return f"pip install -e '{url.removeprefix('file://')}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}] @ {url}'"
