"""The mbn command end to end (subprocesses) and its error handling (in process)."""

import json
import os
import signal
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest
import scipy.sparse as sp

from mbn_core import cli
from mbn_core.bundle import load_bundle
from mbn_core.distribution import DISTRIBUTION
from mbn_core.mbn.outputs.umap import INSTALL_HINT

SMALL = [
    "--n-clusterings", "20", "--k1", "0.1", "--hidden-layer-sizes", "32",
    "--max-epochs", "4", "--n-clusters", "4",
]  # fmt: skip


# A hang detector, not a speed check: a busy machine (load 6 on 2 cores) takes minutes.
DEADLINE = 600


def run_mbn(*args, cwd, timeout=DEADLINE):
    return subprocess.run(
        [sys.executable, "-m", "mbn_core.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_user_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, digits):
    path = tmp_path_factory.mktemp("cli")
    X, y = digits
    np.savez(path / "digits.npz", x=X, y=y)
    np.save(path / "queries.npy", X[:25])
    np.save(path / "narrow.npy", X[:5, :10])
    sp.save_npz(path / "queries_sparse.npz", sp.csr_matrix(X[:25]))
    return path


@pytest.fixture(scope="module")
def trained(workdir):
    result = run_mbn("train", "digits.npz", "--out", "model", "--name", "Digits", *SMALL,
                     cwd=workdir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return workdir / "model", result


@pytest.mark.slow
def test_train_writes_a_bundle_and_prints_the_report(trained):
    path, result = trained
    assert "Traceback" not in result.stderr
    assert "Wrote bundle 'model' (Digits)" in result.stdout
    assert "fidelity:" in result.stdout and "NMI vs labels" in result.stdout
    assert "quality:     trustworthiness / continuity (k=10" in result.stdout
    bundle = load_bundle(path)
    assert bundle.manifest["hyperparameters"]["mbn"]["n_clusterings"] == 20
    assert bundle.n_clusters == 4
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
def test_embed_with_clusters(trained, workdir):
    path, _ = trained
    bundle = load_bundle(path)
    queries = np.load(workdir / "queries.npy")
    result = run_mbn("embed", "model", "queries.npy", "--out", "fast.npy",
                     "--clusters", "clusters.npy", cwd=workdir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(workdir / "fast.npy"), bundle.embed(queries))
    np.testing.assert_array_equal(
        np.load(workdir / "clusters.npy"), bundle.predict_clusters(queries)
    )


@pytest.mark.slow
def test_user_error_is_one_line_with_status_2(trained, workdir):
    result = run_mbn("embed", "model", "narrow.npy", "--out", "x.npy", cwd=workdir)
    assert_user_error(result, "narrow.npy", "10 columns", "expects 64")
    assert not (workdir / "x.npy").exists()


@pytest.mark.slow
def test_interrupt_leaves_no_bundle(workdir):
    # Big enough to still be fitting MBN when the signal arrives: "Training on" is printed
    # once the data is read, as training starts, and the fit takes minutes.
    process = subprocess.Popen(
        [sys.executable, "-m", "mbn_core.cli", "train", "digits.npz", "--out", "interrupted",
         "--n-clusterings", "2000", "--k1", "0.5", "--quiet"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # A shell without job control starts background jobs with SIGINT ignored, and
        # Python keeps an inherited SIG_IGN: give the child the default disposition back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("Training on")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=DEADLINE)
    finally:
        process.kill()
    assert process.returncode == cli.EXIT_INTERRUPTED, stderr
    assert "nothing was written" in stderr
    assert not [p for p in workdir.iterdir() if "interrupted" in p.name]


# ---------------------------------------------------------------------- in process


@pytest.mark.slow
def test_info(trained, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    assert cli.main(["info", "model"]) == 0
    out = capsys.readouterr().out
    assert "id:          model" in out
    assert "64 -> 10 (metric euclidean, pca output" in out  # what output="auto" chose
    assert "MLP epochs, input noise 0.3\n" in out  # what input_noise="auto" chose
    assert "quality:     trustworthiness / continuity" in out and "pca " in out
    assert "input:       no scaling (auto: feature ranges" in out  # digits' pixels
    manifest = load_bundle(workdir / "model").manifest
    # The stored map's t-SNE is part of the job's time.
    assert f"map {manifest['map']['seconds']:.1f} s" in out
    assert "verified:" in out


@pytest.mark.slow
def test_embed_exact_from_sparse_input(trained, workdir, monkeypatch):
    path, _ = trained
    monkeypatch.chdir(workdir)
    argv = ["embed", "model", "queries_sparse.npz", "--out", "exact.npy", "--exact"]
    assert cli.main(argv) == 0
    queries = np.load(workdir / "queries.npy")
    expected = load_bundle(path).embed(queries, mode="exact")
    np.testing.assert_array_equal(np.load(workdir / "exact.npy"), expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["train", "nothing.npy", "--out", "m2"], ["nothing.npy: no such file"]),
        (["info", "missing-dir"], ["mbn info: error:", "missing-dir: no such bundle"]),
        (["info", "digits.npz"], ["digits.npz: a file, not a bundle directory"]),
        (["embed", "model", "digits.txt", "--out", "o.npy"], ["digits.txt: no such file"]),
        (["embed", "model", "queries.npy", "--out", "nodir/o.npy"], ["nodir: no such directory"]),
        (["train", "digits.npz", "--out", "model"], ["model: already exists", "--force"]),
        (
            ["train", "digits.npz", "--out", "m3", "--delta", "2"],
            ["'delta' parameter of MBN must be"],
        ),
        (["train", "digits.npz", "--out", "bad id"], ["model id 'bad id'"]),
        # Sizes no machine holds: refused before the fit by the memory they imply (numpy's
        # MemoryError came after the MBN's fit), not a traceback, nothing written.
        (
            # 10^16 weights: beyond any address space.
            ["train", "digits.npz", "--out", "m4", "--hidden-layer-sizes", "100000000,100000000"],
            ["would need about", "(mlp: ", "more than the", "use smaller layers"],
        ),
    ],
)
def test_errors_in_process(trained, workdir, monkeypatch, capsys, argv, fragments):
    monkeypatch.chdir(workdir)
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for fragment in fragments:
        assert fragment in err
    assert not (workdir / "m4").exists()


def test_a_missing_extra_is_named_without_a_traceback(workdir, monkeypatch, capsys):
    # None in sys.modules makes the import fail as a missing package does.
    monkeypatch.setitem(sys.modules, "umap", None)
    monkeypatch.setitem(sys.modules, "umap.umap_", None)
    monkeypatch.chdir(workdir)
    assert cli.main(["train", "digits.npz", "--out", "u", "--output", "umap"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip() == f"mbn train: error: {INSTALL_HINT}"
    assert not (workdir / "u").exists()


def test_bad_option_syntax_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "d.npy", "--out", "m", "--ks", "4000,x"])
    assert exit_info.value.code == 2
    assert "comma-separated integers" in capsys.readouterr().err


@pytest.mark.slow
def test_info_json(trained, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    assert cli.main(["info", "model", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "model"


def test_a_command_whose_extra_is_missing_says_what_to_install(capsys):
    # An entry point as the base install has it, whose module cannot be imported.
    entry = metadata.EntryPoint(
        name="serve", value="mbn_no_such_module.cli:serve_command [service]",
        group=cli.COMMAND_GROUP,
    )  # fmt: skip
    command = cli.load_command(entry)
    assert cli.main(["serve", "--port", "9000"], commands={"serve": command}) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "mbn serve: error: this command needs the optional dependencies of the service extra "
        "(mbn_no_such_module is not installed): pip install 'mbn-embeddings[service]' "
        "(from a checkout: pip install '.[service]')"
    )


@pytest.mark.slow
def test_the_library_and_the_cli_import_nothing_of_the_service():
    web = {"service", "fastapi", "uvicorn", "sqlalchemy", "psycopg", "msgspec", "pybase64",
           "starlette", "pydantic"}  # fmt: skip
    code = (
        "import sys, mbn_core, mbn_core.cli, mbn_core.pipeline.training, mbn_core.bundle.load;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *web], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_train_help_lists_the_layout_methods_without_importing_their_libraries():
    # `mbn train` builds this parser on every run: importing TriMap there compiled its numba
    # kernels (seconds) before any training started.
    libraries = {"trimap", "pacmap", "openTSNE", "umap", "pynndescent"}
    code = (
        "import contextlib, io, sys; from mbn_core import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, "
        "contextlib.suppress(SystemExit): cli.main(['train', '--help'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))\n"
        "print('trimap' in out.getvalue() and 'not installed here' not in out.getvalue())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *libraries], capture_output=True, text=True, check=True,
        timeout=DEADLINE,
    )  # fmt: skip
    assert result.stdout.split("\n")[:2] == ["[]", "True"], result.stdout


@pytest.mark.slow
def test_the_service_commands_parse(tmp_path):
    # The service's commands as `mbn` gets them from its entry points (python -m service uses
    # the same functions): options and help, without starting anything.
    for command, option in (("serve", "--workers"), ("worker", "training jobs")):
        result = subprocess.run(
            [sys.executable, "-m", "service", command, "--help"],
            capture_output=True, text=True, cwd=tmp_path, timeout=DEADLINE,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert option in result.stdout


@pytest.mark.slow
def test_train_aligned_to_an_earlier_bundle(trained, workdir):
    path, _ = trained
    result = run_mbn("train", "digits.npz", "--out", "aligned", "--name", "Digits",
                     "--align-to", str(path), "--random-state", "1", *SMALL,
                     cwd=workdir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "aligned to:  model on" in result.stdout
    assert load_bundle(workdir / "aligned").manifest["alignment"]["reference_model"] == "model"
    bad = run_mbn("train", "narrow.npy", "--out", "bad", "--align-to", str(path), *SMALL,
                  cwd=workdir)  # fmt: skip
    assert_user_error(bad, "64 features")


def test_train_plan_prints_what_the_fit_will_build_and_writes_nothing(
    workdir, monkeypatch, capsys, digits
):
    from mbn_core.pipeline.training import TrainingParams, fit_shape

    monkeypatch.chdir(workdir)
    before = sorted(workdir.iterdir())
    options = ["--n-clusterings", "20", "--k1", "0.1", "--random-state", "3"]
    assert cli.main(["train", "digits.npz", "--plan", *options]) == 0
    out = capsys.readouterr().out
    params = TrainingParams.from_dict(
        {"method": "mbn", "n_clusterings": 20, "k1": 0.1, "random_state": 3}
    )
    X = digits.X
    n_fit = fit_shape(params, X.shape)[0]
    assert str(params.estimator().plan(X[:n_fit])) in out
    assert f"MBN plan for {n_fit} rows x 64 features" in out
    assert sorted(workdir.iterdir()) == before  # no bundle


def test_train_needs_out_unless_it_plans(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    assert cli.main(["train", "digits.npz"]) == cli.EXIT_USAGE
    assert "--out DIR is required" in capsys.readouterr().err


@pytest.mark.slow
def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mbn_core.cli", "--version"], capture_output=True, text=True
    )
    assert (
        result.returncode == 0 and result.stdout.strip() == f"mbn {metadata.version(DISTRIBUTION)}"
    )


@pytest.mark.slow
def test_train_creates_missing_parent_directories(workdir):
    """The README's `mbn train data.npz --out models/mnist` failed without models/."""
    result = run_mbn("train", "digits.npz", "--out", "new/models/digits", *SMALL, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert load_bundle(workdir / "new" / "models" / "digits").input_dim == 64


@pytest.mark.slow
def test_embed_writes_csv_for_a_csv_path(trained, workdir):
    """A .csv --out held NumPy binary."""
    path, _ = trained
    result = run_mbn("embed", "model", "queries.npy", "--out", "emb.csv", "--clusters",
                     "clusters.csv", cwd=workdir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = np.loadtxt(workdir / "emb.csv", delimiter=",", ndmin=2)
    expected = load_bundle(path).embed(np.load(workdir / "queries.npy"))
    np.testing.assert_allclose(written, expected, rtol=1e-6, atol=1e-6)
    clusters = np.loadtxt(workdir / "clusters.csv", delimiter=",", dtype=np.int64)
    assert clusters.shape == (25,)


@pytest.mark.slow
def test_embed_refuses_an_unknown_output_suffix(trained, workdir):
    result = run_mbn("embed", "model", "queries.npy", "--out", "emb.txt", cwd=workdir)
    assert_user_error(result, "emb.txt", ".npy, .csv, .zarr")


def test_train_chooses_a_csv_s_columns(workdir, monkeypatch, capsys, digits):
    """A pandas CSV's index column was a feature; other columns could not be left out."""
    monkeypatch.chdir(workdir)
    X = digits.X[:400, :6]
    header = ",id,name," + ",".join(f"p{i}" for i in range(6))
    lines = [f"{i},{100 + i},row{i}," + ",".join(f"{v:g}" for v in row) for i, row in enumerate(X)]
    (workdir / "table.csv").write_text("\n".join([header, *lines]) + "\n")
    options = ["--n-clusterings", "10", "--k1", "0.1", "--delta", "0.5", "--output", "pca"]
    assert cli.main(["train", "table.csv", "--plan", "--drop", "id,name", *options]) == 0
    out = capsys.readouterr().out
    assert "left out" in out and "pandas" in out  # the index column, said
    assert "x 6 features" in out
    assert cli.main(["train", "table.csv", "--plan", "--columns", "p0,p1,6", *options]) == 0
    assert "x 3 features" in capsys.readouterr().out
    assert cli.main(["train", "table.csv", "--plan", *options]) == cli.EXIT_USAGE
    assert "'row0' is not a number: data row 1, column 'name' (3)" in capsys.readouterr().err
    assert cli.main(["train", "table.csv", "--plan", "--columns", "P0", *options]) == 2
    assert "did you mean 'p0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: one or the other
        cli.main(["train", "table.csv", "--plan", "--columns", "p0", "--drop", "id"])


def test_info_leads_with_the_measures_a_user_acts_on(capsys) -> None:
    """mbn info showed PCA ahead on trustworthiness and continuity for every model and left
    it at that, though on held-out rows MBN clusters far better: the report read as a loss.
    It now leads with clusters (labels) and the fast path, and says what each measure
    means, PCA's neighbourhood scores included."""
    from pathlib import Path

    golden = Path(__file__).parents[1] / "data" / "golden" / "bundles" / "mbn"
    assert cli.main(["info", str(golden)]) == 0
    out = capsys.readouterr().out
    order = [out.index(f"\n{label}:") for label in ("clusters", "fast path", "fidelity", "quality")]
    assert order == sorted(order)
    assert "clusters:    NMI with the labels, on 300 rows new to the model: exact 0.659" in out
    assert "fast path:   against the exact model: cluster agreement 0.470" in out
    quality = out[out.index("\nquality:") :]
    assert "(reads: trustworthiness / continuity" in quality
    assert "PCA with as many" in quality and "is no loss when clusters" in " ".join(quality.split())
