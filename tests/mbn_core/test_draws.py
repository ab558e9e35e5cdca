"""The compiled draws equal NumPy's ``RandomState.choice`` and ``random_sample`` and leave the
same state."""

import numpy as np
import pytest

from mbn_core.mbn._draws import choose_rows, uniform_below


def numpy_draws(rng: np.random.RandomState, n: int, k: int, times: int) -> np.ndarray:
    return np.stack([rng.choice(n, k, replace=False) for _ in range(times)])


@pytest.mark.parametrize(
    ("n", "k", "times"),
    [(1, 1, 3), (2, 1, 5), (3, 3, 4), (100, 7, 20), (1000, 1000, 3), (70_000, 4000, 2),
     (2**20 + 3, 5, 1), (0, 0, 2)],
)  # fmt: skip
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_the_same_rows_and_state_as_numpy(n, k, times, seed):
    ours, theirs = np.random.RandomState(seed), np.random.RandomState(seed)
    ours.random_sample(seed % 700)  # start anywhere in the 624-word block
    theirs.random_sample(seed % 700)
    got = choose_rows(ours, n, k, times)
    expected = numpy_draws(theirs, n, k, times)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    # The generator goes on exactly where NumPy's calls leave it.
    np.testing.assert_array_equal(ours.randint(0, 2**63, 50), theirs.randint(0, 2**63, 50))
    assert ours.standard_normal() == theirs.standard_normal()


def test_a_cached_gaussian_survives():
    ours, theirs = np.random.RandomState(3), np.random.RandomState(3)
    ours.standard_normal(), theirs.standard_normal()  # leaves a cached second normal
    np.testing.assert_array_equal(choose_rows(ours, 50, 10, 2), numpy_draws(theirs, 50, 10, 2))
    assert ours.standard_normal() == theirs.standard_normal()


def test_other_generators_and_bad_arguments_go_to_numpy():
    pcg = np.random.RandomState(np.random.PCG64(5))
    np.testing.assert_array_equal(
        choose_rows(pcg, 30, 4, 3), numpy_draws(np.random.RandomState(np.random.PCG64(5)), 30, 4, 3)
    )
    with pytest.raises(ValueError, match="larger sample than population"):
        choose_rows(np.random.RandomState(0), 3, 4, 1)


def test_another_thread_drawing_meanwhile_is_not_overwritten():
    """Draws from the same generator on another thread wait for the compiled ones (the
    generator's lock), so every draw lands once: the outcome is some serial order."""
    import threading

    rng = np.random.RandomState(7)
    got: list[float] = []
    started, done = threading.Event(), threading.Event()

    def other():  # draws until the compiled draws are over, and a few more
        started.set()
        while not done.is_set() and len(got) < 1_000_000:
            got.append(rng.random_sample())
        got.extend(rng.random_sample() for _ in range(10))

    thread = threading.Thread(target=other)
    thread.start()
    started.wait()
    rows = choose_rows(rng, 200_000, 10, 20)
    done.set()
    thread.join()
    after = rng.random_sample()
    # Replay: the other thread's draws before the compiled ones are the stream's first
    # values; the rest come after them.
    fresh = np.random.RandomState(7).random_sample(len(got))
    split = next((i for i, value in enumerate(got) if value != fresh[i]), len(got))
    replay = np.random.RandomState(7)
    before = [replay.random_sample() for _ in range(split)]
    np.testing.assert_array_equal(numpy_draws(replay, 200_000, 10, 20), rows)
    rest = [replay.random_sample() for _ in range(len(got) - split)]
    assert before + rest == got
    assert replay.random_sample() == after


@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (2000, 400), (313,)])
@pytest.mark.parametrize("bound", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 99])
def test_uniform_draws_equal_numpys_below_a_bound(shape, bound, seed):
    ours, theirs = np.random.RandomState(seed), np.random.RandomState(seed)
    ours.random_sample(seed % 700)
    theirs.random_sample(seed % 700)
    theirs.standard_normal(), ours.standard_normal()  # a cached second normal survives
    got = uniform_below(ours, shape, bound)
    expected = theirs.random_sample(shape) < bound
    assert got.dtype == np.bool_ and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert ours.standard_normal() == theirs.standard_normal()
    np.testing.assert_array_equal(ours.randint(0, 2**63, 50), theirs.randint(0, 2**63, 50))


def test_uniform_draws_of_other_generators_go_to_numpy():
    ours = np.random.RandomState(np.random.PCG64(5))
    theirs = np.random.RandomState(np.random.PCG64(5))
    np.testing.assert_array_equal(
        uniform_below(ours, (40, 3), 0.5), theirs.random_sample((40, 3)) < 0.5
    )
