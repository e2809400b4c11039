"""The SPANK plugin (``spank/``) loaded by the real local Slurm cluster: ``--elastic=MIN[:MAX]`` end to end.

Each test installs the plugin with ``make -C spank install`` into the cluster's ``plugstack.conf.d`` (sbatch, srun and
salloc read plugstack.conf on every call; slurmstepd on every step), submits real jobs, and puts back whatever
``amoeba.conf`` was there before (normally the default one that ``scripts/slurm-cluster up`` installs), so the
cluster is left as it was found.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ClusterHandle

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SPANK = REPO / "spank"
TIMEOUT_S = 60.0
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run argv (never through a shell) against the cluster."""
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def amoeba_vars(text: str) -> dict[str, str]:
    """The AMOEBA_ELASTIC_* lines of ``env`` output."""
    pairs = (line.split("=", 1) for line in text.splitlines() if line.startswith("AMOEBA_ELASTIC_"))
    return {key: value for key, value in pairs}


@dataclasses.dataclass
class SpankSite:
    """Installs the plugin on the test cluster with given plugstack arguments; submits jobs."""

    cluster: ClusterHandle
    build: Path
    lib: Path
    work: Path

    def install(self, *args: str) -> None:
        result = subprocess.run(
            [
                "make",
                "-C",
                str(SPANK),
                f"BUILD={self.build}",
                f"PLUGIN_DIR={self.lib}",
                f"PLUGSTACK_DIR={self.cluster.plugstack_dir}",
                f"ARGS={' '.join(args)}",
                "install",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert result.returncode == 0, f"make -C spank install failed:\n{result.stdout}\n{result.stderr}"

    def write_conf(self, line: str) -> None:
        """Write amoeba.conf by hand (for arguments `make install` would refuse)."""
        (self.cluster.plugstack_dir / "amoeba.conf").write_text(line + "\n")

    def run(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run(list(argv), env if env is not None else self.cluster.env, self.work)

    def sbatch_wait(
        self, *args: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.CompletedProcess[str], str]:
        """Submit a batch job and wait for it to end (faster than ``sbatch --wait``, which polls every 2 s).

        Returns:
            sbatch's result, with ``returncode`` replaced by the job's exit code, and the job's output.
        """
        result, job_id, out = self.submit(*args, env=env)
        result.returncode = self.wait(job_id)
        return result, out.read_text() if out.exists() else ""

    def submit(
        self, *args: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.CompletedProcess[str], str, Path]:
        """Submit a batch job; returns sbatch's result, the job id and the file the job writes its output to."""
        out = self.work / f"job-{len(list(self.work.glob('job-*.out')))}.out"
        result = self.run("sbatch", "--parsable", "-o", str(out), *args, env=env)
        assert result.returncode == 0, f"sbatch {' '.join(args)} failed: {result.stderr}"
        return result, result.stdout.strip().split(";")[0], out

    def wait(self, job_id: str) -> int:
        """Wait for a job to end; returns its exit code."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            show = self.run("scontrol", "-o", "show", "job", job_id).stdout
            fields = dict(word.split("=", 1) for word in show.split() if "=" in word)
            if fields.get("JobState") in TERMINAL_STATES:
                return int(fields.get("ExitCode", "1:0").split(":")[0])
            assert time.monotonic() < deadline, f"job {job_id} still {fields.get('JobState')} after {TIMEOUT_S}s"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def spank_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A build and a plugin directory for this module (not spank/build, which a developer may be using)."""
    root = tmp_path_factory.mktemp("spank")
    return root / "build", root / "lib"


@pytest.fixture
def spank_site(slurm_cluster: ClusterHandle, spank_files: tuple[Path, Path], tmp_path: Path) -> Iterator[SpankSite]:
    conf = slurm_cluster.plugstack_dir / "amoeba.conf"
    before = conf.read_text() if conf.exists() else None
    build, lib = spank_files
    try:
        yield SpankSite(slurm_cluster, build, lib, tmp_path)
    finally:
        if before is None:
            conf.unlink(missing_ok=True)
        else:
            conf.write_text(before)


def test_cluster_loads_the_plugin_by_default(slurm_cluster: ClusterHandle, tmp_path: Path) -> None:
    """`scripts/slurm-cluster up` installs the plugin with no arguments; each test here puts that back."""
    conf = slurm_cluster.plugstack_dir / "amoeba.conf"
    assert conf.exists(), f"no {conf}: this cluster was started before `up` installed the plugin; restart it"
    lines = [line for line in conf.read_text().splitlines() if not line.startswith("#")]
    assert lines == [f"required {slurm_cluster.root / 'lib' / 'amoeba_spank.so'}"]
    assert "--elastic=MIN[:MAX]" in run(["sbatch", "--help"], slurm_cluster.env, tmp_path).stdout
    srun = run(["srun", "-N1", "-n1", "--elastic=1:2", "env"], slurm_cluster.env, tmp_path)
    assert srun.returncode == 0, srun.stderr
    assert amoeba_vars(srun.stdout) == {
        "AMOEBA_ELASTIC_MIN": "1",
        "AMOEBA_ELASTIC_MAX": "2",
        "AMOEBA_ELASTIC_PARTITION": slurm_cluster.elastic_partition,
    }


def test_sbatch_elastic_2_4_job_sees_min_max_and_partition(spank_site: SpankSite) -> None:
    spank_site.install("max_workers=8")
    result, output = spank_site.sbatch_wait("--elastic=2:4", "--wrap", "env")
    assert result.returncode == 0, result.stderr
    assert amoeba_vars(output) == {
        "AMOEBA_ELASTIC_MIN": "2",
        "AMOEBA_ELASTIC_MAX": "4",
        "AMOEBA_ELASTIC_PARTITION": spank_site.cluster.elastic_partition,
    }


def test_min_alone_means_a_fixed_size(spank_site: SpankSite) -> None:
    spank_site.install()
    result, output = spank_site.sbatch_wait("--elastic=3", "--wrap", "env")
    assert result.returncode == 0, result.stderr
    assert amoeba_vars(output)["AMOEBA_ELASTIC_MIN"] == "3"
    assert amoeba_vars(output)["AMOEBA_ELASTIC_MAX"] == "3"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("5:2", "MIN (5) is above MAX (2); write --elastic=2:5"),
        ("0", "MIN must be at least 1 worker"),
        ("abc", "expected MIN[:MAX] in whole numbers"),
        ("2:9", "asks for more than 8 workers, this site's limit (max_workers in plugstack.conf)"),
    ],
)
def test_submission_rejects_bad_range_naming_flag_and_value(spank_site: SpankSite, value: str, why: str) -> None:
    spank_site.install("max_workers=8")
    result = spank_site.run("sbatch", "--elastic=" + value, "--wrap", "true")
    assert result.returncode != 0
    assert "Submitted batch job" not in result.stdout
    assert f"amoeba: --elastic={value}: {why}" in result.stderr


def test_sbatch_directive_in_script_works_for_script_and_steps(spank_site: SpankSite) -> None:
    spank_site.install()
    script = spank_site.work / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --elastic=1:3\n"
        f"#SBATCH --elastic-partition={spank_site.cluster.regular_partition}\n"
        "env\n"
        "echo STEP\n"
        "srun -n1 env\n"
    )
    result, output = spank_site.sbatch_wait(str(script))
    assert result.returncode == 0, result.stderr
    batch, step = output.split("STEP\n", 1)
    want = {
        "AMOEBA_ELASTIC_MIN": "1",
        "AMOEBA_ELASTIC_MAX": "3",
        "AMOEBA_ELASTIC_PARTITION": spank_site.cluster.regular_partition,
    }
    assert amoeba_vars(batch) == want
    assert amoeba_vars(step) == want


def test_bad_sbatch_directive_is_rejected_at_submit(spank_site: SpankSite) -> None:
    spank_site.install()
    script = spank_site.work / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --elastic=4:1\ntrue\n")
    result = spank_site.run("sbatch", str(script))
    assert result.returncode != 0
    assert "amoeba: --elastic=4:1: MIN (4) is above MAX (1)" in result.stderr


def test_no_elastic_on_the_command_line_beats_the_script(spank_site: SpankSite) -> None:
    spank_site.install()
    script = spank_site.work / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --elastic=1:3\nenv\n")
    env = dict(spank_site.cluster.env, AMOEBA_ELASTIC_MIN="7")  # inherited from an enclosing job
    result, output = spank_site.sbatch_wait("--no-elastic", str(script), env=env)
    assert result.returncode == 0, result.stderr
    assert "SLURM_JOB_ID=" in output
    assert amoeba_vars(output) == {}


def test_lowering_max_workers_does_not_break_steps_of_a_running_job(spank_site: SpankSite) -> None:
    spank_site.install("max_workers=8")
    flag = spank_site.work / "go"
    script = spank_site.work / "job.sh"
    script.write_text(f"#!/bin/bash\nfor i in $(seq 600); do [ -e {flag} ] && break; sleep 0.1; done\nsrun -n1 env\n")
    _, job_id, out = spank_site.submit("--elastic=2:8", str(script))
    spank_site.install("max_workers=4")
    flag.touch()
    assert spank_site.wait(job_id) == 0, out.read_text()
    assert amoeba_vars(out.read_text())["AMOEBA_ELASTIC_MAX"] == "8"


def test_jobs_submitted_inside_an_elastic_job_inherit_it_unless_no_elastic(spank_site: SpankSite) -> None:
    spank_site.install()
    inherit, plain = spank_site.work / "inherit.out", spank_site.work / "plain.out"
    result, output = spank_site.sbatch_wait(
        "--elastic=2:3",
        "--wrap",
        f"sbatch --parsable -o {inherit} --wrap env && sbatch --parsable --no-elastic -o {plain} --wrap env",
    )
    assert result.returncode == 0, output
    inner = output.split()
    assert len(inner) == 2, output
    for job_id in inner:
        assert spank_site.wait(job_id) == 0
    assert amoeba_vars(inherit.read_text())["AMOEBA_ELASTIC_MAX"] == "3"
    assert "SLURM_JOB_ID=" in plain.read_text()
    assert amoeba_vars(plain.read_text()) == {}


def test_export_none_job_still_sees_the_range(spank_site: SpankSite) -> None:
    spank_site.install()
    result, output = spank_site.sbatch_wait("--export=NONE", "--elastic=2:3", "--wrap", "/usr/bin/env")
    assert result.returncode == 0, result.stderr
    assert amoeba_vars(output) == {
        "AMOEBA_ELASTIC_MIN": "2",
        "AMOEBA_ELASTIC_MAX": "3",
        "AMOEBA_ELASTIC_PARTITION": spank_site.cluster.elastic_partition,
    }


def test_srun_and_salloc_take_the_option(spank_site: SpankSite) -> None:
    spank_site.install("default_partition=" + spank_site.cluster.regular_partition)
    srun = spank_site.run("srun", "-N1", "-n1", "--elastic=1:2", "env")
    assert srun.returncode == 0, srun.stderr
    assert amoeba_vars(srun.stdout) == {
        "AMOEBA_ELASTIC_MIN": "1",
        "AMOEBA_ELASTIC_MAX": "2",
        "AMOEBA_ELASTIC_PARTITION": spank_site.cluster.regular_partition,
    }
    salloc = spank_site.run("salloc", "-N1", "--elastic=2", "env")
    assert salloc.returncode == 0, salloc.stderr
    assert amoeba_vars(salloc.stdout)["AMOEBA_ELASTIC_MAX"] == "2"


def test_enabled_0_removes_the_option_and_jobs_run_normally(spank_site: SpankSite) -> None:
    spank_site.install("enabled=0")
    help_text = spank_site.run("sbatch", "--help").stdout
    assert "--elastic" not in help_text
    refused = spank_site.run("sbatch", "--elastic=2:4", "--wrap", "true")
    assert refused.returncode != 0 and "unrecognized option '--elastic=2:4'" in refused.stderr
    result, output = spank_site.sbatch_wait("--wrap", "echo ran normally; env")
    assert result.returncode == 0, result.stderr
    assert "ran normally" in output


def test_sbatch_support_0_hides_the_option_from_sbatch_only(spank_site: SpankSite) -> None:
    spank_site.install("sbatch_support=0")
    refused = spank_site.run("sbatch", "--elastic=2:4", "--wrap", "true")
    assert refused.returncode != 0 and "unrecognized option '--elastic=2:4'" in refused.stderr
    srun = spank_site.run("srun", "-N1", "-n1", "--elastic=1:2", "env")
    assert srun.returncode == 0, srun.stderr
    assert amoeba_vars(srun.stdout)["AMOEBA_ELASTIC_MAX"] == "2"


def test_unknown_plugstack_argument_stops_submission_naming_it(spank_site: SpankSite) -> None:
    spank_site.install()  # builds and copies the plugin
    spank_site.write_conf(f"required {spank_site.lib / 'amoeba_spank.so'} max_workers=8 colour=blue")
    result = spank_site.run("sbatch", "--wrap", "true")
    assert result.returncode != 0
    assert "amoeba: plugstack.conf argument colour=blue is not one of: enabled=0|1 (default 1)" in result.stderr
