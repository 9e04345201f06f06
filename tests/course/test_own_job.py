"""Reading an example trainer's epochs as your own job: the held-out loss after the first and
the last epoch against chance, and whether the model learned."""

from __future__ import annotations

import math

import pytest

from labkit.core.config import ParameterError
from labkit.course import own_job


def _rows(*losses: float) -> list[dict]:
    return [{"epoch": i + 1, "test_loss": loss} for i, loss in enumerate(losses)]


def test_learning_reads_the_first_and_last_epoch_against_chance():
    seen = own_job.learning(_rows(1.05, 0.8, 0.42))
    assert (seen.first_loss, seen.last_loss, seen.last_epoch, seen.epochs) == (1.05, 0.42, 3, 3)
    assert seen.chance == pytest.approx(math.log(3)) == own_job.CHANCE_LOSS
    assert seen.learned and seen.verdict == own_job.LEARNED


@pytest.mark.parametrize(("losses", "chance"), [
    ((1.6, 1.2), math.log(3)),  # fell, but ended above chance (three classes)
    ((1.2, 1.3), math.log(4)),  # below chance, but rose
    ((0.5,), math.log(3)),  # one epoch: nothing to fall from
])
def test_a_run_that_did_not_learn_says_so(losses, chance):
    seen = own_job.learning(_rows(*losses), chance)
    assert not seen.learned and seen.verdict == own_job.NOT_LEARNED
    assert not own_job.learned(_rows(*losses), chance)


def test_chance_is_the_callers_and_no_epochs_is_an_error():
    assert own_job.learning(_rows(1.6, 1.2), math.log(4)).learned  # ln 4 = 1.386: four classes
    assert not own_job.learned([])
    with pytest.raises(ParameterError) as e:
        own_job.learning([])
    assert e.value.name == "rows"
