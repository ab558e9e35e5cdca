"""The handler layer, called directly (no HTTP): real job store, job files, submitter and
model registry in a temporary directory. Each refusal is the domain error that
``service/errors.py`` turns into the answer the route tests check over HTTP."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from servicetest import MAP_POINTS, make_settings

from mbn_core import CompressiveMBN
from mbn_core.bundle import save_bundle
from mbn_core.bundle.embedding_map import MAP_FILE, EmbeddingMap
from service.domain import Conflict, InvalidInput, NotFound, Overloaded, PayloadTooLarge
from service.handlers import JobsHandler, MapsHandler, ModelsHandler, TrainingHandler
from service.jobs import JobFiles, JobStore
from service.registry import ModelRegistry
from service.submission import Submitter

# Small enough for the 40 rows the tests send (the default n_clusters is None).
PARAMS = {"n_clusterings": 5, "hidden_layer_sizes": [8], "max_epochs": 1}


class Jobs:
    """The job side of a service: store, files, and the two handlers on them."""

    def __init__(self, data_dir: Path, **settings: object) -> None:
        self.settings = make_settings(data_dir, **settings)
        self.store = JobStore(self.settings.db_url)
        self.store.create_schema()
        self.files = JobFiles(self.settings.jobs_path)
        self.woken = threading.Event()
        submitter = Submitter(self.settings, self.store, self.files)
        self.training = TrainingHandler(submitter, wake=self.woken.set)
        self.jobs = JobsHandler(self.store, self.files)

    def data_dirs(self) -> list[str]:
        root = self.settings.jobs_path
        return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture
def side(tmp_path: Path) -> Callable[..., Jobs]:
    made: list[Jobs] = []

    def make(**settings: object) -> Jobs:
        jobs = Jobs(tmp_path / f"data{len(made)}", **settings)
        made.append(jobs)
        return jobs

    yield make
    for jobs in made:
        jobs.store.dispose()


def rows(n: int, dim: int = 3) -> list[list[float]]:
    return np.random.default_rng(0).normal(size=(n, dim)).tolist()


def submit_rows(jobs: Jobs, n: int, **overrides: object):
    values: dict[str, object] = {
        "name": "m",
        "method": None,
        "params": PARAMS,
        "data": rows(n),
        "labels": None,
        "promote": False,
    }
    values.update(overrides)
    return jobs.training.submit_rows(**values)  # type: ignore[arg-type]


# --- TrainingHandler --------------------------------------------------------------------------


def test_submit_rows_queues_the_job_stores_its_data_and_wakes_the_worker(side) -> None:
    jobs = side()
    job = submit_rows(jobs, 40, labels=list(range(40)), promote=True)
    assert job.status == "queued" and job.promote and job.method == "mbn"
    assert (job.n_rows, job.n_features) == (40, 3)
    assert job.params["n_clusterings"] == 5 and "alpha" in job.params  # defaults filled in
    assert jobs.woken.is_set()
    assert jobs.data_dirs() == [job.id]
    assert jobs.store.get(job.id) == job


def test_too_few_rows_is_refused_before_anything_is_stored(side) -> None:
    jobs = side()
    with pytest.raises(InvalidInput, match="training needs at least 4 rows, got 3"):
        submit_rows(jobs, 3)
    with pytest.raises(InvalidInput, match="params do not fit 8 rows"):
        submit_rows(jobs, 8, params={**PARAMS, "n_clusters": 10})
    assert jobs.store.list_jobs() == [] and jobs.data_dirs() == []
    assert not jobs.woken.is_set()


def test_bad_params_method_and_labels_are_invalid_input(side) -> None:
    jobs = side()
    with pytest.raises(InvalidInput, match=r"n_jobs.*set by the server"):
        submit_rows(jobs, 40, params={**PARAMS, "n_jobs": 4})
    with pytest.raises(InvalidInput, match=r"device.*set by the server \(MBN_TRAIN_DEVICE\)"):
        submit_rows(jobs, 40, params={**PARAMS, "device": "cuda"})
    with pytest.raises(InvalidInput, match="disagrees"):
        submit_rows(jobs, 40, method="other", params={**PARAMS, "method": "mbn"})
    with pytest.raises(InvalidInput, match="params:"):
        submit_rows(jobs, 40, params={**PARAMS, "alpha": float("inf")})
    with pytest.raises(InvalidInput, match="labels has 39 entries for 40 rows"):
        submit_rows(jobs, 40, labels=list(range(39)))
    # JSON integers have no size limit; int64 labels do.
    with pytest.raises(InvalidInput, match="within 64 bits"):
        submit_rows(jobs, 40, labels=[2**70] * 40)
    assert jobs.store.list_jobs() == [] and jobs.data_dirs() == []


def test_too_many_rows_is_payload_too_large(side) -> None:
    jobs = side(max_train_rows=30)
    with pytest.raises(PayloadTooLarge, match="at most 30"):
        submit_rows(jobs, 40)


def test_a_full_queue_is_refused_at_admission(side) -> None:
    jobs = side(max_queued_jobs=1)
    jobs.training.admit()  # room for one
    submit_rows(jobs, 40)
    with pytest.raises(Overloaded) as refused:
        jobs.training.admit()
    assert refused.value.retry_after == jobs.settings.retry_after_seconds
    with pytest.raises(Overloaded):  # a submission that skipped admission is refused too
        submit_rows(jobs, 40)
    assert len(jobs.data_dirs()) == 1


def test_submit_upload_reads_the_file_type_from_its_name(side) -> None:
    jobs = side()
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(rows(40, dim=5), dtype=np.float32))
    buffer.seek(0)
    job = jobs.training.submit_upload(
        name="up",
        method="mbn",
        params=PARAMS,
        filename="Data.NPY",
        source=buffer,
        promote=False,
    )
    assert (job.name, job.n_rows, job.n_features) == ("up", 40, 5)
    assert (jobs.settings.jobs_path / job.id / "data.npy").is_file()
    with pytest.raises(InvalidInput, match="must end in one of"):
        jobs.training.submit_upload(
            name="up",
            method=None,
            params=PARAMS,
            filename="data.txt",
            source=io.BytesIO(b"1,2\n3,4\n"),
            promote=False,
        )
    assert jobs.data_dirs() == [job.id]


# --- JobsHandler ------------------------------------------------------------------------------


def test_cancel_unknown_or_malformed_job_is_not_found(side) -> None:
    jobs = side()
    for job_id in ("0" * 32, "../etc", ""):
        with pytest.raises(NotFound):
            jobs.jobs.cancel(job_id)
        with pytest.raises(NotFound):
            jobs.jobs.get(job_id)


def test_cancel_a_queued_job_removes_its_data_and_a_second_cancel_conflicts(side) -> None:
    jobs = side()
    job = submit_rows(jobs, 40)
    cancelled = jobs.jobs.cancel(job.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    assert jobs.data_dirs() == []  # no worker will ever read it
    with pytest.raises(Conflict, match="already cancelled"):
        jobs.jobs.cancel(job.id)
    assert jobs.jobs.get(job.id).status == "cancelled"


def test_cancel_a_running_job_leaves_its_data_to_the_worker(side) -> None:
    jobs = side()
    job = submit_rows(jobs, 40)
    claimed = jobs.store.claim("worker-1")
    assert claimed is not None and claimed.id == job.id
    assert jobs.jobs.cancel(job.id).status == "cancelled"
    assert jobs.data_dirs() == [job.id]  # the worker stops the training and cleans up


def test_list_jobs_newest_first_by_status(side) -> None:
    jobs = side()
    first = submit_rows(jobs, 40, name="a")
    second = submit_rows(jobs, 40, name="b")
    jobs.jobs.cancel(first.id)
    assert [j.id for j in jobs.jobs.list_jobs()] == [second.id, first.id]
    assert [j.id for j in jobs.jobs.list_jobs(status="cancelled")] == [first.id]
    assert [j.id for j in jobs.jobs.list_jobs(limit=1)] == [second.id]


# --- ModelsHandler ----------------------------------------------------------------------------


@pytest.fixture
def model_dir(tmp_path: Path, write_bundle: Callable[..., Path]) -> Path:
    """``m-old`` and ``m-new`` (versions of "digits") and ``m-other``."""
    path = tmp_path / "models"
    write_bundle(path, "m-old", "digits", created="2024-01-01T00:00:00Z")
    write_bundle(path, "m-other", "other", created="2024-06-01T00:00:00Z")
    write_bundle(path, "m-new", "digits", created="2025-01-01T00:00:00Z")
    return path


def models_handler(model_dir: Path) -> ModelsHandler:
    registry = ModelRegistry(model_dir)
    registry.rescan()
    return ModelsHandler(registry)


def test_list_models_newest_first_with_the_choices(model_dir: Path) -> None:
    handler = models_handler(model_dir)
    (model_dir / "m-broken").mkdir()
    (model_dir / "m-broken" / "manifest.json").write_text("{not json")
    handler.registry.rescan()
    listing = handler.list_models()
    assert [m.id for m in listing.models] == ["m-new", "m-other", "m-old", "m-broken"]
    by_id = {m.id: m for m in listing.models}
    assert listing.default == "m-old" and listing.default_source == "auto"
    assert by_id["m-old"].default and by_id["m-old"].current
    assert not by_id["m-new"].default and not by_id["m-new"].current
    assert (by_id["m-new"].input_dim, by_id["m-new"].output_dim) == (64, 10)
    broken = by_id["m-broken"]
    assert broken.state == "damaged" and broken.problem and not broken.default
    assert str(model_dir) not in broken.problem


def test_promote_makes_a_version_current_and_the_default(model_dir: Path) -> None:
    handler = models_handler(model_dir)
    entry = handler.promote("m-new")
    assert entry.id == "m-new" and entry.default and entry.current
    listing = handler.list_models()
    assert listing.default == "m-new" and listing.default_source == "promoted"
    assert handler.manifest("digits")["id"] == "m-new"
    # Only the name: the default stays.
    entry = handler.promote("m-old", default=False)
    assert entry.current and not entry.default
    assert handler.list_models().default == "m-new"


def test_promote_takes_an_id_not_a_name(model_dir: Path) -> None:
    handler = models_handler(model_dir)
    with pytest.raises(NotFound, match="promote takes an id"):
        handler.promote("digits")
    with pytest.raises(NotFound):
        handler.promote("m-none")


def test_deleting_the_default_or_a_current_version_needs_force(model_dir: Path) -> None:
    handler = models_handler(model_dir)
    with pytest.raises(Conflict, match="is the default model"):
        handler.delete("m-old")
    handler.promote("m-other")  # m-old stays the version "digits" means
    with pytest.raises(Conflict, match="the version the name 'digits' resolves to"):
        handler.delete("m-old")
    assert (model_dir / "m-old").is_dir()
    handler.delete("m-new")  # neither: no force needed
    handler.delete("m-other", force=True)
    assert [m.id for m in handler.list_models().models] == ["m-old"]
    assert not (model_dir / "m-new").exists() and not (model_dir / "m-other").exists()
    with pytest.raises(NotFound):
        handler.manifest("m-new")


def test_manifest_by_id_or_name(model_dir: Path) -> None:
    handler = models_handler(model_dir)
    assert handler.manifest("m-other")["name"] == "other"
    assert handler.manifest("digits")["id"] == "m-old"
    with pytest.raises(NotFound):
        handler.manifest("nothing")


# --- MapsHandler ------------------------------------------------------------------------------


@pytest.fixture
def maps(
    model_dir: Path, tiny_model: CompressiveMBN, digits_map: EmbeddingMap
) -> Callable[..., MapsHandler]:
    """``m-mapped`` (name "mapped") has a stored map; the others none."""
    save_bundle(
        tiny_model,
        model_dir / "m-mapped",
        name="mapped",
        extra_files={MAP_FILE: digits_map.to_bytes()},
        manifest_sections={"map": digits_map.summary()},
    )
    registry = ModelRegistry(model_dir)
    registry.rescan()
    return lambda max_rows=100: MapsHandler(registry, max_rows=max_rows)


@pytest.mark.slow
def test_stored_map(maps, digits_map: EmbeddingMap, digits) -> None:
    view = maps().stored_map("mapped")
    assert (view.model_id, view.name) == ("m-mapped", "mapped")
    assert view.map.n_points == MAP_POINTS and view.n_samples == len(digits[1])
    np.testing.assert_array_equal(view.map.xy, digits_map.xy)
    with pytest.raises(NotFound, match="has no stored map"):
        maps().stored_map("m-old")
    with pytest.raises(NotFound):
        maps().stored_map("m-none")


@pytest.mark.slow
def test_locate_places_the_maps_own_embeddings_on_their_points(
    maps, digits_map: EmbeddingMap
) -> None:
    # Points whose embedding no other point shares (MBN's embeddings can coincide: those
    # land between their points) are their own nearest neighbour by far.
    embedding = digits_map.embedding.astype(np.float64)
    gaps = np.linalg.norm(embedding[:, None] - embedding[None], axis=2)
    np.fill_diagonal(gaps, np.inf)
    alone = np.flatnonzero(gaps.min(axis=1) > 1e-3)[:10]
    assert len(alone) == 10
    located = maps().locate("mapped", digits_map.embedding[alone].tolist())
    assert located.model_id == "m-mapped" and located.xy.shape == (len(alone), 2)
    np.testing.assert_allclose(located.xy, digits_map.xy[alone], atol=0.05)


@pytest.mark.slow
def test_locate_refuses_what_does_not_fit(maps) -> None:
    good = [[0.0] * 10]
    with pytest.raises(PayloadTooLarge, match="at most 2 per request"):
        maps(max_rows=2).locate("m-mapped", good * 3)
    with pytest.raises(InvalidInput, match="must have 10 numbers"):
        maps().locate("m-mapped", [[0.0] * 9])
    with pytest.raises(InvalidInput, match="NaN, infinity or a value beyond the float32 range"):
        maps().locate("m-mapped", [[float("nan")] * 10])
    with pytest.raises(InvalidInput, match="beyond the float32 range"):
        maps().locate("m-mapped", [[1e39] * 10])
    with pytest.raises(NotFound, match="has no stored map"):
        maps().locate("m-other", good)
