"""sbatch's command line, #SBATCH lines and time formats as sbatch 22.05-25.11 reads them (``slurm/options.py``)."""

from __future__ import annotations

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.slurm.options import (
    Arity,
    SbatchOption,
    last_value,
    parse_time_minutes,
    read_directives,
    resolve_long,
    sbatch_options,
    split_command_line,
    wrap_script,
)
from slurm_amoeba.slurm.release import SlurmRelease


def names_values(options: list[SbatchOption]) -> list[tuple[str, str | None]]:
    return [(o.name, o.value) for o in options]


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("30", 30),
        ("1:00:00", 60),
        ("2-00:00:00", 2880),
        ("5:30", 6),  # MM:SS, rounded up like Slurm
        ("0:90", 2),  # sbatch 22.05 took this as 00:02:00 (measured)
        ("1:75:00", 135),  # measured: 02:15:00
        ("1-25", 2940),  # D-HH, measured: 2-01:00:00
        ("2-3:4", 3064),  # D-HH:MM
        ("2-3:4:5", 3065),  # D-HH:MM:SS
        (" 45 ", 45),
    ],
)
def test_slurm_time_formats_become_minutes(text: str, minutes: int) -> None:
    assert parse_time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["0", "-1", "INFINITE", "unlimited"])
def test_no_limit_spellings_mean_none(text: str) -> None:
    assert parse_time_minutes(text) is None


@pytest.mark.parametrize("text", ["1h", "30s", "1:00:00:00", "", "1-", "-5", "a:b", "1.5"])
def test_other_times_are_refused_with_the_formats(text: str) -> None:
    with pytest.raises(SpecError, match=r"is not a Slurm time: write MINUTES, MM:SS, HH:MM:SS"):
        parse_time_minutes(text)


def test_options_take_values_in_every_spelling_sbatch_reads() -> None:
    options, rest = split_command_line(
        ["-t", "30", "-t1:00:00", "--time=5", "--time", "6", "-A", "acct", "--qos=q", "-C", "a&b", "job.sh", "-t", "9"]
    )
    assert names_values(options) == [
        ("time", "30"),
        ("time", "1:00:00"),
        ("time", "5"),
        ("time", "6"),
        ("account", "acct"),
        ("qos", "q"),
        ("constraint", "a&b"),
    ]
    assert rest == ["job.sh", "-t", "9"]
    assert options[0].words == ("-t", "30") and options[1].words == ("-t1:00:00",)


def test_mem_and_gpus_are_sbatchs_own_not_abbreviations() -> None:
    options, rest = split_command_line(["--mem", "32000", "--gpus", "4", "x.sh"])
    assert names_values(options) == [("mem", "32000"), ("gpus", "4")] and rest == ["x.sh"]


def test_short_flags_cluster_and_the_last_may_take_a_value() -> None:
    options, rest = split_command_line(["-HvJname", "-Qp", "batch", "s.sh"])
    flags = [("hold", None), ("verbose", None), ("job-name", "name"), ("quiet", None)]
    assert names_values(options) == [*flags, ("partition", "batch")]
    assert rest == ["s.sh"]


def test_optional_values_only_follow_an_equals_sign() -> None:
    options, rest = split_command_line(["--exclusive", "job.sh"])
    assert names_values(options) == [("exclusive", None)] and rest == ["job.sh"]
    assert names_values(split_command_line(["--exclusive=user"])[0]) == [("exclusive", "user")]


def test_unique_prefixes_resolve_like_getopt_and_ambiguous_ones_are_refused() -> None:
    assert resolve_long("reserv") == "reservation"
    assert resolve_long("gpus") == "gpus"  # an exact name wins over longer ones
    assert resolve_long("nosuch") is None
    with pytest.raises(SpecError, match=r"--acc is ambiguous for sbatch: it could be --account, --acctg-freq"):
        resolve_long("acc")


def test_unknown_long_options_pass_as_written() -> None:
    options, rest = split_command_line(["--container-image=x", "--container-writable", "job.sh"])
    assert [(o.name, o.value, o.known) for o in options] == [
        ("container-image", "x", False),
        ("container-writable", None, False),
    ]
    assert rest == ["job.sh"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-t"], "-t needs a value"),
        (["--time"], "--time needs a value"),
        (["--hold=yes"], "--hold takes no value"),
        (["-y"], "sbatch has no option -y"),
        (["-n", "1", ":", "-n", "2"], r"':' \(heterogeneous components\)"),
    ],
)
def test_malformed_command_lines_are_refused(argv: list[str], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        split_command_line(argv)


def test_directives_are_read_until_the_first_command_with_comments_and_quotes() -> None:
    script = (
        "#!/bin/bash\n"
        "#SBATCH --elastic=2:8\n"
        "#SBATCH --ntasks=2 --gpus-per-task=1    # the minimum workers\n"
        "# a comment\n"
        '#SBATCH -J "two words"\n'
        " #SBATCH --qos=not-a-directive\n"
        "\n"
        "echo start\n"
        "#SBATCH -t 99\n"
    )
    options = read_directives(script)
    assert names_values(options) == [
        ("elastic", "2:8"),
        ("ntasks", "2"),
        ("gpus-per-task", "1"),
        ("job-name", "two words"),
    ]
    assert last_value(options, "elastic") == "2:8" and last_value(options, "time") is None


def test_a_heterogeneous_script_is_refused() -> None:
    with pytest.raises(SpecError, match="#SBATCH hetjob"):
        read_directives("#!/bin/bash\n#SBATCH -n 1\n#SBATCH hetjob\n#SBATCH -n 2\n")


def test_last_value_wins_as_in_sbatch() -> None:
    options, _ = split_command_line(["-p", "a", "--partition=b"])
    assert last_value(options, "partition") == "b"


def test_wrap_script_is_what_sbatch_writes() -> None:
    assert wrap_script("amoeba-run python t.py") == (
        "#!/bin/sh\n# This script was created by sbatch --wrap.\n\namoeba-run python t.py\n"
    )


def test_the_plugins_options_take_their_value_in_either_spelling() -> None:
    options = read_directives("#!/bin/bash\n#SBATCH --elastic 2:8\n#SBATCH --elastic-partition=spot --no-elastic\n")
    assert [(o.name, o.value, o.known) for o in options] == [
        ("elastic", "2:8", True),
        ("elastic-partition", "spot", True),
        ("no-elastic", None, True),
    ]


@pytest.mark.parametrize(
    ("release", "known"),
    [(SlurmRelease(22, 5, 8), False), (SlurmRelease(23, 2, 7), True), (SlurmRelease(25, 11, 1), True), (None, True)],
)
def test_tres_per_task_is_sbatchs_own_from_23_02_and_passes_with_its_value_before(
    release: SlurmRelease | None, known: bool
) -> None:
    options, rest = split_command_line(["--tres-per-task", "gres/gpu:1", "job.sh"], release)
    assert [(o.name, o.value, o.words, o.known) for o in options] == [
        ("tres-per-task", "gres/gpu:1", ("--tres-per-task", "gres/gpu:1"), known)
    ]
    assert rest == ["job.sh"]


def test_each_release_knows_the_options_its_sbatch_added_dropped_or_changed() -> None:
    assert "tres-bind" not in sbatch_options(SlurmRelease(23, 2)) and "tres-bind" in sbatch_options(
        SlurmRelease(23, 11)
    )
    assert "power" in sbatch_options(SlurmRelease(23, 11)) and "power" not in sbatch_options(SlurmRelease(24, 5))
    assert "export-file" not in sbatch_options(SlurmRelease(23, 11))
    assert sbatch_options(SlurmRelease(24, 11))["get-user-env"][1] is Arity.OPTIONAL
    assert sbatch_options(SlurmRelease(25, 5))["get-user-env"][1] is Arity.NONE
    assert sbatch_options(SlurmRelease(25, 11))["requeue"][1] is Arity.OPTIONAL
    everything = sbatch_options(None)
    assert {"power", "export-file", "resources", "oom-kill-step"} <= everything.keys()
    assert everything["get-user-env"][1] is Arity.OPTIONAL  # changed arity: read with = only
    # a prefix unique in 22.05 is ambiguous once 23.02 adds --extra
    assert resolve_long("extr", SlurmRelease(22, 5)) == "extra-node-info"
    with pytest.raises(SpecError, match="ambiguous"):
        resolve_long("extr", SlurmRelease(23, 2))


def test_an_unknown_flag_before_the_script_stays_a_flag() -> None:
    options, rest = split_command_line(["--container-writable", "job.sh"])
    assert [(o.name, o.value) for o in options] == [("container-writable", None)] and rest == ["job.sh"]
