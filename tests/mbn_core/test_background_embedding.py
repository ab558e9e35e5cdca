"""The held-out rows' exact embedding, computed beside the student: the values ``transform``
gives on the caller's thread, and a report identical to one computed after the student."""

import threading

import numpy as np
import pytest

from mbn_core import MBN, CompressiveMBN
from mbn_core.pipeline import background_embedding
from mbn_core.pipeline.background_embedding import BackgroundEmbedding


class RecordingMBN(MBN):
    """An MBN that notes the thread of every ``transform``."""

    threads: list[str] = []

    def transform(self, X):
        RecordingMBN.threads.append(threading.current_thread().name)
        return super().transform(X)


def small_model():
    teacher = RecordingMBN(n_clusterings=30, k1=0.1, random_state=0)
    return CompressiveMBN(teacher, hidden_layer_sizes=(32,), max_epochs=5, random_state=0,
                          report_folds=None, n_clusters=10)  # fmt: skip


@pytest.fixture(scope="module")
def teacher(digits):
    return MBN(n_clusterings=20, k1=0.1, random_state=0).fit(digits.X[:600])


def test_the_embedding_is_transform_on_the_callers_thread_bit_for_bit(digits, teacher):
    rows = digits.X[600:900]
    beside = BackgroundEmbedding(rows)
    beside.start(teacher)
    beside.start(MBN())  # only the first start counts
    got = beside.result(teacher)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, teacher.transform(rows))


def test_another_estimator_is_computed_here_and_a_failure_is_raised(digits, teacher):
    rows = digits.X[600:700]
    never_started = BackgroundEmbedding(rows)
    np.testing.assert_array_equal(never_started.result(teacher), teacher.transform(rows))
    beside = BackgroundEmbedding(rows[:, :10])  # too few features for the teacher
    beside.start(teacher)
    with pytest.raises(ValueError, match="features"):
        beside.result(teacher)


def test_a_fit_embeds_its_held_out_rows_beside_the_student(monkeypatch, digits):
    X, y = digits.X[:800], digits.y[:800]
    RecordingMBN.threads.clear()
    model = small_model().fit(X, y)
    assert "mbn-held-out" in RecordingMBN.threads
    # The same report with the held-out rows embedded after the student, on this thread.
    monkeypatch.setattr(background_embedding.BackgroundEmbedding, "start", lambda *args: None)
    RecordingMBN.threads.clear()
    after = small_model().fit(X, y)
    assert "mbn-held-out" not in RecordingMBN.threads
    assert model.fidelity_ == after.fidelity_ and model.quality_ == after.quality_
    np.testing.assert_array_equal(model.cluster_centers_, after.cluster_centers_)
