"""Where a fit's time goes (mbn_core.mbn.phases): every phase of a fit is timed inside
``timed_phases``, and nothing is recorded outside it."""

import threading

import numpy as np
import pytest

from mbn_core import MBN
from mbn_core.mbn.phases import PHASES, PhaseTimes, phase, timed_phases


def test_a_fit_records_every_phase(digits):
    X = digits.X[:400]
    with timed_phases() as times:
        MBN(n_clusterings=20, random_state=0, n_jobs=1).fit(X)
    assert set(times.seconds) == set(PHASES)
    # feature_fraction="auto" and delta="auto" are measured; every phase took some time.
    assert all(seconds > 0 for seconds in times.seconds.values()), times.seconds


def test_nothing_is_recorded_outside_or_on_other_threads():
    with timed_phases() as times:
        other = threading.Thread(
            target=lambda: MBN(n_clusterings=5, random_state=0, n_jobs=1).fit(
                np.random.default_rng(0).random((60, 4))
            )
        )
        other.start()
        other.join()
    assert sum(times.seconds.values()) == 0
    with phase("upper"):  # no record open: a no-op
        pass


def test_an_unknown_phase_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown phase 'layers'; phases are auto"):
        PhaseTimes().add("layers", 1.0)
