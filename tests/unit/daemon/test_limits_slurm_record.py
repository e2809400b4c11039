"""An agent's claimed worker range against what Slurm recorded at submission (issue 11, "limits are the site's").

``tests/data/slurm/squeue-elastic-shapes.json`` is ``squeue --json`` of the local cluster (Slurm 22.05.8) holding
job 66, submitted in amoeba-sbatch's shape (``sbatch --ntasks=1 --cpus-per-task=1 : --ntasks=2 --cpus-per-task=1
--gpus-per-task=1``, components 66 and 67), and job 70, one component submitted with the SPANK plugin
(``sbatch --elastic=2:5 --ntasks=2 --gpus-per-task=1``); both held, then cancelled.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_amoeba.daemon.agents import Registration
from slurm_amoeba.daemon.config import Limits
from slurm_amoeba.daemon.limits import LimitError, vet_registration
from slurm_amoeba.daemon.observer import SubmissionBook, Submitted, SubmittedComponent, submitted_of
from slurm_amoeba.slurm import JobRecord, parse_squeue_json
from tests.unit.daemon.fakes import job, register_body, req
from tests.unit.daemon.test_daemon import cluster, make_daemon, recorder

RECORDED = parse_squeue_json(
    (Path(__file__).resolve().parents[2] / "data" / "slurm" / "squeue-elastic-shapes.json").read_text()
)


def claim(job_id: str = "66", low: int = 2, high: int = 4, gpus: int = 1) -> Registration:
    body = {**register_body(job_id, low=low, high=high), "gpus_per_worker": gpus}
    return Registration.from_body(body)


def test_the_recording_gives_each_jobs_components() -> None:
    found = submitted_of(RECORDED, {"66", "70", "999"})
    assert found == {
        "66": Submitted("66", (SubmittedComponent(0, 1, 0), SubmittedComponent(1, 2, 1))),
        "70": Submitted("70", (SubmittedComponent(0, 2, 1),)),
    }
    assert found["66"].workers == SubmittedComponent(1, 2, 1) and found["70"].workers is None


RECORDS = [job(66, het_job_id=66, het_job_offset=0), job(67, het_job_id=66, het_job_offset=1, gpus={"n1": 2})]


def test_a_claim_that_matches_slurms_record_is_taken_as_it_is() -> None:
    submitted = submitted_of(RECORDED, {"66"})["66"]
    vetted = vet_registration(claim(), RECORDS, Limits(), submitted)
    assert vetted.notes == () and (vetted.registration.min_workers, vetted.registration.max_workers) == (2, 4)


@pytest.mark.parametrize("low", [1, 3])
def test_a_claimed_minimum_is_slurms_and_the_note_names_both(low: int) -> None:
    submitted = submitted_of(RECORDED, {"66"})["66"]
    vetted = vet_registration(claim(low=low), RECORDS, Limits(), submitted)
    assert vetted.registration.min_workers == 2
    assert vetted.notes == (
        f"min_workers set from {low} to 2: Slurm's record of job 66 (component 1, --ntasks=2) says so",
    )


def test_claimed_gpus_per_worker_that_slurm_does_not_record_are_refused_naming_both() -> None:
    submitted = submitted_of(RECORDED, {"66", "70"})
    says = r"GPU\(s\) per worker, but Slurm's record of its workers says 1 \(--gpus-per-task of component"
    with pytest.raises(LimitError, match=rf"claims 2 {says} 1\)"):
        vet_registration(claim(gpus=2), RECORDS, Limits(), submitted["66"])
    with pytest.raises(LimitError, match=rf"claims 4 {says} 0\)"):
        vet_registration(claim("70", gpus=4), [job(70, gpus={"n1": 2})], Limits(), submitted["70"])


def test_a_spank_job_keeps_its_claimed_minimum_and_the_site_caps_its_maximum() -> None:
    submitted = submitted_of(RECORDED, {"70"})["70"]
    vetted = vet_registration(claim("70", low=1, high=99), [job(70, gpus={"n1": 2})], Limits(max_workers=8), submitted)
    assert (vetted.registration.min_workers, vetted.registration.max_workers) == (1, 8)


def test_a_heterogeneous_job_of_another_shape_is_not_managed() -> None:
    three = Submitted("66", (SubmittedComponent(0, 1, 0), SubmittedComponent(1, 2, 1), SubmittedComponent(2, 1, 1)))
    with pytest.raises(LimitError, match="heterogeneous job of 3 components"):
        vet_registration(claim(), RECORDS, Limits(), three)
    gpu_agent = Submitted("66", (SubmittedComponent(0, 1, 1), SubmittedComponent(1, 2, 1)))
    with pytest.raises(LimitError, match="heterogeneous job of 2 components"):
        vet_registration(claim(), RECORDS, Limits(), gpu_agent)


def test_the_book_reads_wanted_jobs_only_on_refresh_and_forgets_finished_ones() -> None:
    reads: list[int] = []

    def read() -> list[JobRecord]:
        reads.append(1)
        return RECORDED

    book = SubmissionBook(read)
    assert book.available and book.get("66") is None and reads == []  # the loop never reads Slurm
    book.refresh({"66", "70"})
    assert book.get("66") is not None and reads == [1]
    book.refresh({"66", "70"})
    assert reads == [1], "nothing wanted: no read"
    book.refresh(set())
    assert book.get("66") is None, "a job no longer active is forgotten (and wanted again)"
    book.refresh({"12345"})  # 66 is wanted but not active: dropped from the wanted set, nothing kept
    book.refresh({"66"})
    assert book.get("66") is None and reads == [1]
    assert not SubmissionBook(None).available


def test_a_registration_waits_for_slurms_record_then_takes_its_minimum(tmp_path: Path) -> None:
    shapes = [
        dataclasses.replace(job(100, het_job_id=100, het_job_offset=0), tasks=1),
        dataclasses.replace(job(101, het_job_id=100, het_job_offset=1), tasks=2, gpus_per_task=1),
    ]
    d = make_daemon(tmp_path, cluster())
    try:
        d.round_loop.submissions = book = SubmissionBook(lambda: shapes)
        d.handle(req("register", register_body("100", low=1, high=4)))
        first = recorder(d).last()
        assert not first.body["ok"] and "reading Slurm's record" in first.body["error"]
        assert d.round_loop.refresh_wanted and "100" not in d.agents
        book.refresh({"100"})  # what the next round does on its Slurm thread
        d.handle(req("register", register_body("100", low=1, high=4)))
        reply = recorder(d).last()
        assert reply.body["ok"], reply.body
        assert d.agents["100"].registration.min_workers == 2
        assert reply.body["data"]["clamped"] == [
            "min_workers set from 1 to 2: Slurm's record of job 100 (component 1, --ntasks=2) says so"
        ]
    finally:
        d.close()


def test_without_slurms_record_a_registration_is_vetted_as_before(tmp_path: Path) -> None:
    d = make_daemon(tmp_path, cluster())  # a fake Slurm: the book is not available
    try:
        assert not d.round_loop.submissions.available
        d.handle(req("register", register_body("100", low=1, high=4)))
        assert recorder(d).last().body["ok"]
    finally:
        d.close()
