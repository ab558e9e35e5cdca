# shellcheck shell=bash
# Sourced by scripts/test and scripts/serve (from the repository root): the virtual environment.
#   ensure_venv              create .venv (MBN_VENV) with Python >= 3.11 (PYTHON) if missing
#   install_project EXTRAS [GROUP]
#                            pip install -e ".EXTRAS" (and the PEP 735 dependency group GROUP
#                            of pyproject.toml, with a pip new enough for groups) into it,
#                            skipped while pyproject.toml is unchanged since the last install
#                            with those extras and that group

VENV=${MBN_VENV:-.venv}

find_python() {
    local candidate
    for candidate in ${PYTHON:-} python3 python3.11 python3.12 python3.13; do
        if command -v "$candidate" >/dev/null \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "no Python >= 3.11 found (set PYTHON=/path/to/python3.11)" >&2
    return 1
}

ensure_venv() {
    [[ -x $VENV/bin/python ]] && return
    local python
    python=$(find_python)
    # Debian's Python has no ensurepip (so no venv) without the python3-venv package.
    if ! "$python" -c 'import ensurepip' 2>/dev/null; then
        if [[ $(id -u) != 0 ]]; then
            echo "$python cannot create virtual environments: install python3-venv" >&2
            return 1
        fi
        echo "installing python3-venv" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "python3-venv" "python$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv" >/dev/null
    fi
    echo "creating $VENV with $python ($("$python" --version))" >&2
    "$python" -m venv "$VENV"
}

install_project() {
    local extras=$1 group=${2:-}
    local stamp=$VENV/.mbn-installed${extras:+-${extras//[^a-z]/}}${group:+-group-$group}
    local want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
        return
    fi
    local args=(-e ".$extras")
    if [[ -n $group ]]; then
        args+=(--group "$group")
        ensure_pip_with_groups || return 1
    fi
    echo "installing the project into $VENV: pip install ${args[*]} (log: $VENV/pip.log)" >&2
    # The project was installed as "mbn" before it took a name of its own (mbn-embeddings):
    # that install would keep a second copy of the `mbn` command.
    "$VENV/bin/python" -m pip uninstall --disable-pip-version-check -y -q mbn >/dev/null 2>&1 || true
    # The first install takes a minute or more: each package is shown as pip reaches it.
    local status=0
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
        "${args[@]}" 2>&1 | tee "$VENV/pip.log" | pip_progress >&2 || status=$?
    if [[ $status -ne 0 ]]; then
        tail -n 30 "$VENV/pip.log" >&2
        return 1
    fi
    echo "$want" >"$stamp"
}

# Dependency groups (PEP 735, pyproject.toml's [dependency-groups]) need pip 25.1: a venv
# made by an older Python's ensurepip gets a newer pip first.
ensure_pip_with_groups() {
    if "$VENV/bin/python" -c 'import sys, pip
sys.exit(tuple(int(part) for part in pip.__version__.split(".")[:2]) < (25, 1))' 2>/dev/null; then
        return
    fi
    echo "upgrading pip in $VENV (dependency groups need pip >= 25.1)" >&2
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q \
        --upgrade "pip>=25.1"
}

# pip's output, shortened to one line per package and the final summary.
pip_progress() {
    { grep --line-buffered -E '^(Collecting|Installing collected|Successfully)' || true; } \
        | sed -u -e 's/^Collecting \([^ ]*\).*/  pip: getting \1/' \
            -e 's/^Installing collected packages: .*/  pip: installing the packages/' \
            -e 's/^Successfully installed.*/  pip: done/'
}
