"""The daemon's configuration: the shipped file is valid; every mistake is named with its key and value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.cli import amoebad
from slurm_amoeba.daemon import ConfigError, DaemonConfig, load_config, parse_config
from slurm_amoeba.daemon.config import RESTART_ONLY

REPO = Path(__file__).resolve().parents[3]


def test_the_shipped_config_is_valid_and_asks_slurm_to_start_pending_jobs_itself() -> None:
    config = load_config(REPO / "configs" / "amoebad.yaml")
    assert config.policy == "elastic-backfill"
    assert config.regular_partitions == ("batch",)
    assert config.elastic_partition == "elastic"
    assert config.effective_knobs() == {"min_gain": 0.1, "start_pending": False}


def test_an_empty_document_means_every_default() -> None:
    assert parse_config(None) == DaemonConfig(source="<config>")


def test_the_front_process_is_off_unless_the_site_switches_it_on_and_takes_a_restart() -> None:
    assert parse_config(None).front_process is False and parse_config({"front_process": True}).front_process
    assert "front_process" in RESTART_ONLY


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({"interval": 5}, "'interval'"),
        ({"agents": {"timout_s": 3}}, "'agents.timout_s'"),
        ({"metrics": {"host": "x"}}, "'metrics.host'"),
        ({"policy": {"name": "e-tiresias", "knobs": {"min_gian": 0.2}}}, "'policy.knobs.min_gian'"),
    ],
)
def test_an_unknown_key_is_refused_with_its_full_path_and_the_valid_keys(doc: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match="unknown key") as info:
        parse_config(doc, "site.yaml")
    assert named in str(info.value)
    assert str(info.value).startswith("site.yaml: ")


def test_an_unknown_key_lists_its_sections_valid_keys_with_their_defaults() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": {"timout_s": 3}}, "site.yaml")
    assert str(info.value).endswith(
        "valid keys (with their defaults) are: timeout_s=3.0, retries=1, parallel=8, stale_after_s=10.0, backoff_s=30.0"
    )


@pytest.mark.parametrize(
    ("doc", "key", "value"),
    [
        ({"interval_s": -1}, "interval_s", "-1"),
        ({"interval_s": "fast"}, "interval_s", "'fast'"),
        ({"listen": "0.0.0.0:6820"}, "listen", "'0.0.0.0:6820'"),
        ({"listen": "tcp://0.0.0.0:70000"}, "listen", "'tcp://0.0.0.0:70000'"),
        ({"metrics": {"port": 99999}}, "metrics.port", "99999"),
        ({"metrics": {"address": "everywhere"}}, "metrics.address", "'everywhere'"),
        ({"policy": {"name": "lottery"}}, "policy.name", "'lottery'"),
        ({"policy": {"knobs": {"min_gain": "high"}}}, "policy.knobs.min_gain", "'high'"),
        ({"partitions": {"regular": []}}, "partitions.regular", "[]"),
        ({"partitions": {"regular": ["batch"], "elastic": "batch"}}, "partitions.elastic", "'batch'"),
        ({"operators": ["no-such-user-here"]}, "operators", "'no-such-user-here'"),
        ({"operators": "root"}, "operators", "'root'"),
        ({"agents": {"retries": True}}, "agents.retries", "True"),
        ({"agents": {"parallel": 0}}, "agents.parallel", "0"),
        ({"state_file": "state.json"}, "state_file", "'state.json'"),
        ({"log_level": "loud"}, "log_level", "'loud'"),
        ({"slurm": {"conf": "/nonexistent/slurm.conf"}}, "slurm.conf", "'/nonexistent/slurm.conf'"),
        ({"sharing": {"enabled": "yes"}}, "sharing.enabled", "'yes'"),
        ({"front_process": "on"}, "front_process", "'on'"),
        ({"sharing": {"partitions": ["share"]}}, "sharing.partitions", "['share']"),
        ({"sharing": {"partitions": {"share": 65}}}, "sharing.partitions.share", "65"),
        ({"sharing": {"partitions": {"share": True}}}, "sharing.partitions.share", "True"),
        ({"sharing": {"partitions": {"a b": 1}}}, "sharing.partitions", "'a b'"),
        ({"sharing": {"enabled": True}}, "sharing.partitions", "{}"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key_and_the_value(doc: dict[str, Any], key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc, "site.yaml")
    assert f"site.yaml: {key} = {value} is invalid" in str(info.value)


def test_a_policy_knob_out_of_range_is_refused_with_the_policys_reason() -> None:
    with pytest.raises(ConfigError, match=r"policy.knobs .*min_gain=-1"):
        parse_config({"policy": {"name": "elastic-backfill", "knobs": {"min_gain": -1}}})


def test_operators_resolve_to_uids_and_groups() -> None:
    config = parse_config({"operators": ["root", 4242, "@root"]})
    assert config.operator_uids == frozenset({0, 4242})
    assert config.operator_gids == frozenset({0})


def test_a_file_that_is_not_yaml_or_missing_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("interval_s: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_amoebad_check_exits_2_and_names_the_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "amoebad.yaml"
    path.write_text("interval_s: 5\npolicy:\n  name: elastic-backfill\n  colour: blue\n")
    run = subprocess.run(
        [sys.executable, "-m", "slurm_amoeba.cli.amoebad", "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "unknown key 'policy.colour'" in run.stderr
    good = subprocess.run(
        [sys.executable, "-m", "slurm_amoeba.cli.amoebad", "--config", str(REPO / "configs/amoebad.yaml"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert good.returncode == 0, good.stderr
    assert "elastic-backfill" in good.stdout


def test_amoebad_check_refuses_a_policy_that_shares_gpus_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "amoebad.yaml"
    path.write_text("policy:\n  name: sjf-bsbf\n")
    assert amoebad.main(["--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "policy 'sjf-bsbf' cannot run in amoebad: its share actions cannot be applied live" in err
    assert "choose a policy that only resizes" in err


def test_amoebad_check_accepts_a_policy_that_shares_gpus_once_the_site_switches_sharing_on(tmp_path: Path) -> None:
    path = tmp_path / "amoebad.yaml"
    path.write_text("policy:\n  name: sjf-bsbf\nsharing:\n  enabled: true\n  partitions: {share: 4}\n")
    assert amoebad.main(["--config", str(path), "--check"]) == 0


def test_sharing_is_off_by_default_and_a_partition_not_named_hosts_nobody() -> None:
    assert parse_config({}).sharing.limit("share") == 0
    sharing = parse_config({"sharing": {"enabled": True, "partitions": {"share": 4, "gpu": 0}}}).sharing
    assert (sharing.limit("share"), sharing.limit("gpu"), sharing.limit("batch")) == (4, 0, 0)
    assert parse_config({"sharing": {"partitions": {"share": 4}}}).sharing.limit("share") == 0


def test_the_systemd_unit_runs_the_daemon_unprivileged_after_checking_its_config() -> None:
    unit = (REPO / "configs" / "systemd" / "amoebad.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.lstrip().startswith("#")
    )
    assert settings["User"] == "amoebad" and settings["Group"] == "amoebad"
    assert settings["CapabilityBoundingSet"] == "" and settings["NoNewPrivileges"] == "yes"
    assert settings["ExecStartPre"].endswith("--config /etc/amoebad/amoebad.yaml --check")
    assert settings["ExecStart"].endswith("amoebad --config /etc/amoebad/amoebad.yaml")
    assert settings["StateDirectory"] == "amoebad"
    assert load_config(REPO / "configs" / "amoebad.yaml").state_file == "/var/lib/amoebad/state.json"


def test_limits_are_read_with_users_by_name_or_uid_and_accounts() -> None:
    config = parse_config(
        {
            "limits": {
                "requests_per_s": 5,
                "burst": 10,
                "agents_per_uid": 3,
                "max_workers": 16,
                "max_workers_per_user": {"root": 4, 65534: 2},
                "max_workers_per_account": {"physics": 8},
            }
        }
    )
    limits = config.limits
    assert (limits.requests_per_s, limits.burst, limits.agents_per_uid, limits.max_workers) == (5.0, 10, 3, 16)
    assert limits.user_max_workers == {0: 4, 65534: 2}
    assert limits.worker_cap(0, "physics") == (4, "limits.max_workers_per_user (uid 0)")
    assert limits.worker_cap(1, "physics") == (8, "limits.max_workers_per_account (physics)")
    assert limits.worker_cap(1, "") == (16, "limits.max_workers")


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"max_worker": 4}, "unknown key 'limits.max_worker'"),
        ({"max_workers_per_user": {"no-such-user-xyz": 2}}, "no user 'no-such-user-xyz'"),
        ({"max_workers": 8, "max_workers_per_account": {"a": 9}}, "limits.max_workers_per_account.a = 9"),
        ({"max_workers_per_account": {"bad name": 2}}, "Slurm account name"),
        ({"requests_per_s": 0}, "limits.requests_per_s = 0"),
        ({"requests_per_s": 10, "agents_per_uid": 64}, "send 32 reports per second"),
    ],
)
def test_a_bad_limit_is_refused_by_name(limits: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"limits": limits}, "site.yaml")
    assert named in str(info.value)
