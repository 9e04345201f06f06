"""Sourced facts about Spot and Vertex AI: every fact names its page and the date it was read,
and where the service documents no value, the code assumes less than the documented one."""

from __future__ import annotations

import datetime as dt

from labkit.hardware import facts, spot


def test_every_fact_has_a_source_and_a_read_date():
    for f in [v for v in vars(facts).values() if isinstance(v, facts.Fact)]:
        assert f.url.startswith("https://") and isinstance(f.read_on, dt.date), f.statement
        assert f.url in f.text() and f.read_on.isoformat() in f.text()


def test_the_sigterm_grace_assumed_is_less_than_compute_engines_documented_notice():
    assert facts.SPOT_SHUTDOWN_S.documented and facts.SPOT_SHUTDOWN_S.value == 30
    assert not facts.CONTAINER_SIGTERM_GRACE_S.documented
    assert spot.SIGTERM_NOTICE_S == facts.CONTAINER_SIGTERM_GRACE_S.value < facts.SPOT_SHUTDOWN_S.value


def test_a_sigterm_checkpoint_longer_than_the_assumed_grace_counts_as_lost_work():
    fits = spot.SpotModel(checkpoint_on_sigterm=True, checkpoint_write_s=spot.SIGTERM_NOTICE_S)
    too_slow = spot.SpotModel(checkpoint_on_sigterm=True, checkpoint_write_s=spot.SIGTERM_NOTICE_S + 1)
    assert fits.lost_per_preemption_s == 0 and too_slow.lost_per_preemption_s > 0


def test_restart_rules_include_what_happens_after_the_worker_restarts_run_out():
    rules = facts.restart_rules()
    assert any("up to six times" in r for r in rules)
    assert any("After five restarts" in r and "three times" in r for r in rules)
    assert any("permanent" in r and "user code exception" in r for r in rules)
    assert any("SIGABRT" in r and "SIGSEGV" in r and "three times" in r for r in rules)
    assert all(facts.RULES_READ_ON.isoformat() in r for r in rules)


def test_vertex_premium_is_computed_from_both_rate_cards():
    assert facts.VERTEX_TRAINING_PREMIUM == facts.VERTEX_TRAINING_N1_STANDARD_4.value / facts.COMPUTE_N1_STANDARD_4.value
    assert facts.VERTEX_TRAINING_PREMIUM > 1
