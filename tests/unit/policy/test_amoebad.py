"""The ``amoebad`` policy's composition: layers by name, their knobs, and the combinations refused."""

from __future__ import annotations

import pytest

from slurm_amoeba.policy import Place, PolicyError, Resize, make_policy, policy_knobs
from slurm_amoeba.policy.amoebad import AdmissionLayer, AmoebadPolicy, ElasticLayer, LasOrderLayer, WholeNodeLayer
from slurm_amoeba.policy.slurm_baseline import SlurmBaselinePolicy

from .helpers import job, sizes, snapshot


def test_make_policy_builds_the_layers_named_by_switches_and_dotted_knobs() -> None:
    policy = make_policy(
        "amoebad",
        weight_age=10.0,
        admission=True,
        whole_node=True,
        **{"admission.max_hold_s": 0.0, "elastic.min_gain": 0.2, "whole_node.moves_minimum": True},
    )
    assert policy == AmoebadPolicy(
        weight_age=10.0,
        elastic=ElasticLayer(min_gain=0.2),
        admission=AdmissionLayer(max_hold_s=0.0),
        whole_node=WholeNodeLayer(moves_minimum=True),
    )
    assert make_policy("amoebad") == AmoebadPolicy()
    assert AmoebadPolicy().admission is None and AmoebadPolicy().las_order is None


def test_policy_knobs_lists_slurms_knobs_the_layer_switches_and_every_layer_knob_with_its_default() -> None:
    knobs = policy_knobs("amoebad")
    slurm = policy_knobs("slurm")
    assert {key: knobs[key] for key in slurm} == slurm
    assert knobs["admission"] is False and knobs["whole_node"] is False and knobs["las_order"] is False
    assert knobs["admission.max_hold_s"] == AdmissionLayer().max_hold_s
    assert knobs["elastic.submitted_at"] == "minimum"
    assert "elastic" not in knobs, "the elastic layer is always present"
    assert not any(key in knobs for key in ("grow_elastic", "admit_at_request", "las_queue_s")), "no flat switches"


def test_the_slurm_policy_takes_no_daemon_knob() -> None:
    assert "min_gain" not in policy_knobs("slurm")
    with pytest.raises(PolicyError, match="grow_elastic"):
        make_policy("slurm", grow_elastic=True)


def test_an_unknown_knob_is_refused_with_the_valid_ones_listed() -> None:
    with pytest.raises(PolicyError, match=r"admission\.max_hold") as caught:
        make_policy("amoebad", **{"admission.max_hold": 1.0})
    assert "admission.max_hold_s" in str(caught.value) and "elastic.min_gain" in str(caught.value)


def test_a_knob_of_a_layer_that_is_off_is_refused() -> None:
    with pytest.raises(PolicyError, match=r"admission\.max_hold_s set, but the admission layer is off"):
        make_policy("amoebad", **{"admission.max_hold_s": 0.0})
    with pytest.raises(PolicyError, match="switches the las_order layer"):
        make_policy("amoebad", las_order="yes")


@pytest.mark.parametrize(
    ("layers", "refusal"),
    [
        ({"whole_node": WholeNodeLayer()}, "whole-node layer is modelled under the admission layer"),
        (
            {"admission": AdmissionLayer(), "elastic": ElasticLayer(submitted_at="request")},
            "submitted_at='request'",
        ),
        (
            {"admission": AdmissionLayer(compact_admissions=True), "elastic": ElasticLayer(compact_starts=False)},
            "compact_starts=true",
        ),
    ],
)
def test_combinations_that_mean_nothing_are_refused_when_built(layers: dict[str, object], refusal: str) -> None:
    with pytest.raises(PolicyError, match=refusal):
        AmoebadPolicy(**layers)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("knobs", "refusal"),
    [
        ({"elastic.min_gain": -1.0}, r"elastic\.min_gain=-1\.0"),
        ({"admission": True, "admission.max_hold_s": -1.0}, r"admission\.max_hold_s=-1\.0"),
        ({"las_order": True, "las_order.thresholds_gpu_s": (7200.0, 3600.0)}, "increasing"),
        ({"elastic.submitted_at": "maximum"}, "submitted_at='maximum'"),
        ({"whole_node": True}, "add admission=true or drop whole_node"),
    ],
)
def test_a_layer_knob_out_of_range_is_refused_with_its_dotted_name(knobs: dict[str, object], refusal: str) -> None:
    with pytest.raises(PolicyError, match=refusal):
        make_policy("amoebad", **knobs)


def test_the_policy_emits_resizes_and_with_the_whole_node_layer_places() -> None:
    assert SlurmBaselinePolicy().emits.isdisjoint({Resize, Place})
    assert Resize in AmoebadPolicy().emits and Place not in AmoebadPolicy().emits
    assert Place in AmoebadPolicy(admission=AdmissionLayer(), whole_node=WholeNodeLayer()).emits


def test_las_order_with_several_thresholds_sorts_by_queue_then_submit_time() -> None:
    served = job("served", 4, submit=0.0, attained_service=10_000.0, time_limit=600.0)
    middle = job("middle", 4, submit=1.0, attained_service=2_000.0, time_limit=600.0)
    fresh = job("fresh", 4, submit=5.0, time_limit=600.0)
    cluster = snapshot([4], [served, middle, fresh])
    order = AmoebadPolicy(las_order=LasOrderLayer((1000.0, 5000.0))).queue_order(cluster, now=10.0)
    assert [j.job_id for j in order] == ["fresh", "middle", "served"]
    assert sizes(AmoebadPolicy(las_order=LasOrderLayer((1000.0, 5000.0))).decide(cluster, now=10.0)) == {"fresh": 4}
