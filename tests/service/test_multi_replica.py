"""Several replicas on a real PostgreSQL: two API processes and two ``mbn worker`` processes
sharing the database, the data dir and the model dir."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from digits_data import Digits
from servicetest import (
    FAST_JOBS_ENV,
    LONG_PARAMS,
    MBN_COMMAND,
    TINY_PARAMS,
    Process,
    Server,
    wait_for,
    wait_for_job,
    wait_for_progress,
)

# Slow: API and worker processes sharing a PostgreSQL, training real jobs.
pytestmark = pytest.mark.slow


def test_two_apis_two_workers(
    tmp_path: Path, postgres_url: str, digits: Digits, processes: list[Process]
) -> None:
    env = {
        **FAST_JOBS_ENV,
        "MBN_DATA_DIR": str(tmp_path / "shared"),
        "MBN_DATABASE_URL": postgres_url,
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_DEMO_MODEL": "false",
    }
    workers = [
        Process([*MBN_COMMAND, "worker"], env, tmp_path / f"worker{i}.log") for i in range(2)
    ]
    apis = [Server(env, tmp_path / f"api{i}.log") for i in range(2)]
    processes.extend([*workers, *apis])
    for worker in workers:
        worker.start()
    for api in apis:
        api.start()
    wait_for(
        lambda: all(" ready" in w.log_tail(200) for w in workers), 60, "both workers to be ready"
    )
    a, b = (api.client() for api in apis)
    try:
        x = digits[0]
        submitted = [
            a.post(
                "/train", json={"name": f"m{i}", "data": x[:300].tolist(), "params": TINY_PARAMS}
            )
            for i in range(3)
        ]
        assert all(r.status_code == 202 for r in submitted), [r.text for r in submitted]
        job_ids = [r.json()["id"] for r in submitted]

        # Submitted through A: visible, and followed to the end, through B.
        done = [wait_for_job(b, job_id, {"succeeded", "failed"}, 120) for job_id in job_ids]
        assert [j["status"] for j in done] == ["succeeded"] * 3, [j["error"] for j in done]
        assert sorted(j["id"] for j in b.get("/jobs").json()["jobs"]) == sorted(job_ids)

        # Each ran exactly once: one attempt, one start in the logs, one model.
        assert all(j["attempts"] == 1 and j["model_id"] == f"{j['id']}-1" for j in done)
        logs = "".join(w.log_tail(2000) for w in workers)
        starts = Counter(re.findall(r"job ([0-9a-f]{32}): attempt \d+ started", logs))
        assert starts == Counter(job_ids)
        took_jobs = [bool(re.search(r"attempt \d+ started", w.log_tail(2000))) for w in workers]
        assert all(took_jobs), "both workers should have shared the queue"
        models_dir = tmp_path / "shared" / "models"
        assert sorted(p.name for p in models_dir.iterdir() if not p.name.startswith(".")) == sorted(
            j["model_id"] for j in done
        )

        # Usable through both APIs, by id and by name.
        rows = x[:3].tolist()
        for client in (a, b):
            for ref in (done[2]["model_id"], "m2"):
                response = client.post("/embed", json={"model": ref, "inputs": rows})
                assert response.status_code == 200, response.text
                assert response.json()["model"] == done[2]["model_id"]

        # Cancel through B a job A accepted and a worker process runs.
        long_id = a.post("/train", json={"data": x.tolist(), "params": LONG_PARAMS}).json()["id"]
        wait_for_progress(b, long_id)
        assert b.post(f"/jobs/{long_id}/cancel").json()["status"] == "cancelled"
        wait_for(
            lambda: f"job {long_id}: no longer ours" in "".join(w.log_tail(200) for w in workers),
            20,
            "the worker to stop the cancelled training",
        )
        assert a.get(f"/jobs/{long_id}").json()["status"] == "cancelled"

        # Deleted through A: gone from B too (at its next rescan). Not the default model (the
        # first one a replica saw, which only a forced delete removes).
        default = a.get("/models").json()["default"]
        victim = next(j["model_id"] for j in done if j["model_id"] != default)
        assert a.delete(f"/models/{victim}").status_code == 204
        wait_for(
            lambda: b.get(f"/models/{victim}").status_code == 404,
            10,
            "B to notice the deletion",
        )
        assert len(b.get("/models").json()["models"]) == 2
    finally:
        a.close()
        b.close()
    for process in [*apis, *workers]:
        process.stop()
