#!/usr/bin/env bash
# Build ./Dockerfile for real and smoke-test the image, on a machine without a Docker engine or a
# registry (how: docs/DEPLOYMENT.md, "CI and the container check"). Needs root; installs podman if missing.
#
#   docker/check-image.sh            build, run on 127.0.0.1:$MBN_CHECK_PORT, probe, clean up
#
# The base image is a stand-in: Debian bookworm with Python 3.11 made with debootstrap from the
# apt mirror, imported under the Dockerfile's FROM name. It and podman's layer store are cached in
# MBN_IMAGE_CACHE, so a rerun takes seconds when nothing changed. Exits non-zero when the image
# does not build, does not answer, or answers wrongly; prints the container's log then.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${MBN_CHECK_PORT:-18931}
IMAGE=localhost/mbn:check
NAME=mbn-check-$$
READY_TIMEOUT=${MBN_CHECK_READY_TIMEOUT:-600}   # the first start trains the demo model

t() { echo "[check-image $(date +%T)] $*"; }
fail() {
    echo "check-image: FAILED: $*" >&2
    exit 1
}

# shellcheck source=docker/podman-lib.sh
source "$ROOT/docker/podman-lib.sh"
podman_setup

# ---- build ----------------------------------------------------------------------------------
build_app_image "$IMAGE"

# ---- run and probe --------------------------------------------------------------------------
cleanup() {
    "${podman[@]}" rm -f -v -t 5 "$NAME" >/dev/null 2>&1 || true
}
trap cleanup EXIT
probe_failed() {
    echo "---- container log ($NAME) ----" >&2
    "${podman[@]}" logs "$NAME" 2>&1 | tail -n 60 >&2 || true
    fail "$*"
}
url=http://127.0.0.1:$PORT

# The image's own static properties.
[[ $("${podman[@]}" run --rm --no-healthcheck "$IMAGE" id -u) != 0 ]] || fail "the image runs as root"
compilers=$("${podman[@]}" run --rm --no-healthcheck "$IMAGE" sh -c 'command -v gcc cc c++ clang || true')
[[ -z $compilers ]] || fail "compilers in the final image: $compilers"
# The image holds this tree's code, not a cached build's (a layer reused whatever it was built
# from): every installed module's SHA-256 against the tree's file.
"${podman[@]}" run --rm -i --no-healthcheck --entrypoint /opt/venv/bin/python "$IMAGE" - \
    <"$ROOT/docker/code_digest.py" | python3 "$ROOT/docker/code_digest.py" --check "$ROOT" \
    || fail "the image's code is not this tree's"
healthcheck=$("${podman[@]}" image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE")
[[ $healthcheck == *health/live* ]] || fail "no HEALTHCHECK on /health/live in the image: $healthcheck"

t "running the image on $url (its default command, as a deployment would)"
# --health-interval=disable: no systemd timer here; `podman healthcheck run` below runs it once.
quiet "${podman[@]}" run -d --name "$NAME" --network=host --health-interval=disable -e MBN_HOST=127.0.0.1 -e MBN_PORT="$PORT" \
    "$IMAGE" >/dev/null || fail "podman run"

wait_for() {  # wait_for PATH SECONDS
    local deadline=$((SECONDS + $2))
    until curl -fsS -o /dev/null "$url$1" 2>/dev/null; do
        [[ $("${podman[@]}" inspect --format '{{.State.Running}}' "$NAME") == true ]] \
            || probe_failed "the container exited before $1 answered"
        ((SECONDS < deadline)) || probe_failed "$1 did not answer 200 within $2 s"
        sleep 1
    done
}
start=$SECONDS
wait_for /health/live 120
t "/health/live answered after $((SECONDS - start)) s"
"${podman[@]}" healthcheck run "$NAME" || probe_failed "the image's HEALTHCHECK command fails"
wait_for /health/ready "$READY_TIMEOUT"
t "/health/ready answered after $((SECONDS - start)) s (demo model trained)"

row=$(python3 -c 'print([float(i % 17) for i in range(64)])')   # the demo model: 64 digit pixels
for mode in fast exact; do
    answer=$(curl -fsS -X POST "$url/embed" -H 'Content-Type: application/json' \
        -d "{\"inputs\": [$row, $row], \"mode\": \"$mode\"}") || probe_failed "POST /embed ($mode)"
    python3 -c '
import json, sys
body = json.loads(sys.argv[1])
rows = body["embeddings"]
assert body["mode"] == sys.argv[2] and len(rows) == 2 and len(rows[0]) == body["dim"] > 0, body
' "$answer" "$mode" || probe_failed "POST /embed ($mode) answered $answer"
    t "POST /embed ($mode) answered ${answer:0:80}..."
done

# The demo training and the exact path ran numba kernels: their cache must have been writable.
cached=$("${podman[@]}" exec "$NAME" sh -c 'ls -A "$NUMBA_CACHE_DIR"') || probe_failed "podman exec"
[[ -n $cached ]] || probe_failed "numba wrote nothing to NUMBA_CACHE_DIR"

t "stopping (SIGTERM)"
quiet "${podman[@]}" stop -t 30 "$NAME" >/dev/null
code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$NAME")
[[ $code == 0 ]] || probe_failed "exit status $code after SIGTERM"
t "OK: $IMAGE builds, runs as non-root, answers /health/live, /health/ready and /embed, caches numba kernels, stops cleanly"
