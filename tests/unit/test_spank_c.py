"""The C side of the SPANK plugin (``spank/``): its own unit, hook and fuzz tests, run from pytest.

``make -C spank test`` builds the plugin with ``-Werror`` (so any compiler warning fails here), checks that it exports
only ``slurm_spank_*`` and ``plugin_*``, and runs the C tests of the parsers and hooks and a randomized test under
AddressSanitizer and UndefinedBehaviorSanitizer. It builds into a fresh directory each time, so a stale object never
hides a warning. No Slurm cluster is needed, only gcc, make and Debian's libslurm-dev headers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPANK = REPO / "spank"
SPANK_HEADER = Path("/usr/include/slurm/spank.h")


def _missing_tools() -> str | None:
    for tool in ("gcc", "make", "nm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed; scripts/bootstrap installs it"
    if not SPANK_HEADER.exists():
        return f"{SPANK_HEADER} is missing; install Debian's libslurm-dev (scripts/bootstrap does)"
    return None


def _make(*targets: str, build: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(SPANK), f"BUILD={build}", *targets],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def spank_test_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    reason = _missing_tools()
    if reason is not None:
        pytest.skip(reason)
    return _make("test", build=tmp_path_factory.mktemp("spank-build"))


def test_c_unit_hook_and_fuzz_tests_pass_under_sanitizers(
    spank_test_run: subprocess.CompletedProcess[str],
) -> None:
    out = spank_test_run.stdout + spank_test_run.stderr
    assert spank_test_run.returncode == 0, f"make -C spank test failed (exit {spank_test_run.returncode}):\n{out}"
    for name in ("test_parse", "test_plugin"):
        assert re.search(rf"^{name}: [1-9][0-9]* checks, 0 failed$", out, re.MULTILINE), out
    assert "fuzz_parse: 200000 iterations" in out and " 0 failures" in out, out


def test_plugin_builds_without_warnings(spank_test_run: subprocess.CompletedProcess[str]) -> None:
    out = spank_test_run.stdout + spank_test_run.stderr
    assert "warning:" not in out, f"the plugin or its tests compile with warnings:\n{out}"


def test_plugin_exports_only_the_spank_hooks_and_plugin_symbols(
    spank_test_run: subprocess.CompletedProcess[str],
) -> None:
    out = spank_test_run.stdout + spank_test_run.stderr
    line = next((x for x in out.splitlines() if x.startswith("check-symbols:")), "")
    exported = set(line.split("exports only:", 1)[1].split()) if "exports only:" in line else set()
    assert exported == {
        "plugin_name",
        "plugin_type",
        "plugin_version",
        "slurm_spank_init",
        "slurm_spank_init_post_opt",
        "slurm_spank_user_init",
    }, out


def test_install_rejects_bad_plugstack_arguments_naming_them(tmp_path: Path) -> None:
    reason = _missing_tools()
    if reason is not None:
        pytest.skip(reason)
    build = tmp_path / "build"
    plugstack = tmp_path / "plugstack.conf.d"
    result = _make(
        "install",
        f"PLUGSTACK_DIR={plugstack}",
        f"PLUGIN_DIR={tmp_path / 'lib'}",
        "ARGS=max_workers=8 colour=blue",
        build=build,
    )
    assert result.returncode != 0
    assert "plugstack.conf argument colour=blue is not one of: enabled=0|1 (default 1)" in result.stderr
    assert not (plugstack / "amoeba.conf").exists()


def test_install_writes_the_plugstack_line(tmp_path: Path) -> None:
    reason = _missing_tools()
    if reason is not None:
        pytest.skip(reason)
    plugstack = tmp_path / "plugstack.conf.d"
    lib = tmp_path / "lib"
    result = _make(
        "install",
        f"PLUGSTACK_DIR={plugstack}",
        f"PLUGIN_DIR={lib}",
        "ARGS=max_workers=8 default_partition=spot",
        build=tmp_path / "build",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [x for x in (plugstack / "amoeba.conf").read_text().splitlines() if not x.startswith("#")]
    assert lines == [f"required {lib / 'amoeba_spank.so'} max_workers=8 default_partition=spot"]
    assert (lib / "amoeba_spank.so").is_file()
