"""amoebad's collector settings once started (:func:`slurm_amoeba.cli.amoebad.tune_gc`)."""

from __future__ import annotations

import gc

from slurm_amoeba.cli.amoebad import GC_THRESHOLD, tune_gc


def test_the_started_daemon_freezes_what_start_up_built_and_collects_less_often() -> None:
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_THRESHOLD, before[1], before[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
