# shellcheck shell=bash
# Sourced by docker/check-image.sh and scripts/compose-check: podman on a machine without a Docker
# engine or a registry (how: docs/DEPLOYMENT.md, "CI and the container check"). Needs root.
#
#   podman_setup               install podman & co. when missing, take the cache's lock, write
#                              the podman configuration; sets the array `podman` (podman with
#                              this cache's store) and exports CONTAINERS_CONF and
#                              CONTAINERS_STORAGE_CONF, so any podman (podman-compose's too)
#                              uses the same store
#   base_image                 the stand-in Debian bookworm base image (debootstrap from the apt
#                              mirror, once; cached in $CACHE/base.tar); prints its tag
#   tag_froms BASE DOCKERFILE  tag BASE with every FROM name DOCKERFILE uses
#   build_app_image TAG        build ./Dockerfile as TAG (layers cached in the store)
#   quiet COMMAND...           run COMMAND without podman's systemd complaints on stderr
#
# Everything lives in MBN_IMAGE_CACHE (default /var/tmp/mbn-image): the base tarball and podman's
# layer store, so a rerun takes seconds when nothing changed. The caller sets ROOT (the repository)
# and defines t() (progress) and fail() (message and exit).

CACHE=${MBN_IMAGE_CACHE:-/var/tmp/mbn-image}

# The Debian packages each tool comes from. catatonit is podman's --init (compose's `init: true`).
declare -A PODMAN_TOOLS=(
    [podman]=podman [runc]=runc [debootstrap]=debootstrap [curl]=curl [catatonit]=catatonit
)

install_tools() {  # install_tools COMMAND...: apt-get install the packages of missing commands
    local command missing=()
    for command in "$@"; do
        command -v "$command" >/dev/null || missing+=("${PODMAN_TOOLS[$command]:-$command}")
    done
    ((${#missing[@]})) || return 0
    t "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" ca-certificates >/dev/null
}

podman_setup() {
    [[ $(id -u) == 0 ]] || fail "needs root (debootstrap and podman's root storage)"
    install_tools podman runc debootstrap curl catatonit
    mkdir -p "$CACHE"
    # One run at a time per cache (shared podman store, image tags, ports).
    exec 9>"$CACHE/lock"
    flock -n 9 || { t "waiting for another run on $CACHE to finish"; flock 9; }

    # crun refuses this kind of VM's cgroups, and podman's default rlimits exceed the hard limits
    # here.
    cat >"$CACHE/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
CONF
    # The store in the cache, named in a file rather than with --root: podman-compose runs podman
    # itself, and conmon's clean-up and restart commands must find the same store.
    cat >"$CACHE/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$CACHE/storage"
runroot = "$CACHE/run"
CONF
    export CONTAINERS_CONF=$CACHE/containers.conf CONTAINERS_STORAGE_CONF=$CACHE/storage.conf
    podman=(podman)
    # A store first used without a driver named (check-image.sh before this file) records ""
    # as its driver; conmon's clean-up command names "overlay" and is then refused, and with it
    # every restart policy (a killed container stayed down). Such a store is made anew, once.
    if [[ -d $CACHE/storage ]] && ! env -u CONTAINERS_STORAGE_CONF podman --root "$CACHE/storage" \
        --runroot "$CACHE/run" --storage-driver overlay info >/dev/null 2>&1; then
        t "resetting $CACHE/storage: it was made with another storage driver"
        timeout 120 podman system reset --force >/dev/null 2>&1 || true
        # podman mounts its overlay directory onto itself; nothing else may stay mounted there.
        findmnt -rn -o TARGET | grep -E "^$CACHE/(storage|run)(/|$)" | sort -r \
            | xargs -r umount -l 2>/dev/null || true
        rm -rf "$CACHE/storage" "$CACHE/run"
    fi
}

# Without systemd, podman complains about healthcheck timers at every run, stop and rm.
quiet() {
    "$@" 2> >(grep -v 'unable to get systemd connection' >&2)
}

base_image() {
    if [[ ! -s $CACHE/base.tar ]]; then
        local mirror rootfs=$CACHE/rootfs
        mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
        mirror=${mirror:-http://deb.debian.org/debian}
        t "debootstrap bookworm from $mirror (once; cached in $CACHE/base.tar)" >&2
        rm -rf "$rootfs"
        debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
            bookworm "$rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -n 20 "$CACHE/debootstrap.log" >&2; fail "debootstrap"; }
        # pip and apt inside builds reach their servers through whatever CA this machine trusts.
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
        chroot "$rootfs" update-ca-certificates >/dev/null
        # Where python:3.11-slim has them.
        ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
        ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"
        chroot "$rootfs" apt-get clean
        tar -C "$rootfs" -cf "$CACHE/base.tar.tmp" . && mv "$CACHE/base.tar.tmp" "$CACHE/base.tar"
        rm -rf "$rootfs"
    fi
    local base_id tag
    base_id=$(sha256sum "$CACHE/base.tar" | cut -c1-12)
    tag=localhost/mbn-base:$base_id
    if ! "${podman[@]}" image exists "$tag"; then
        t "importing the base image" >&2
        "${podman[@]}" import -q --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
            "$CACHE/base.tar" "$tag" >/dev/null
    fi
    echo "$tag"
}

tag_froms() {  # tag_froms BASE DOCKERFILE
    local from
    for from in $(awk 'toupper($1) == "FROM" { for (i = 2; i <= NF; i++) if ($i !~ /^--/) { print $i; break } }' \
        "$2" | sort -u); do
        case $from in
            scratch | \$* | builder) continue ;;
        esac
        "${podman[@]}" tag "$1" "$from"
    done
}

build_app_image() {  # build_app_image TAG
    local base
    base=$(base_image)
    tag_froms "$base" "$ROOT/Dockerfile"
    # Layers of builds older than a day go: the cache stays warm without growing without bound.
    "${podman[@]}" image prune -f --filter until=24h >/dev/null
    t "building $1"
    local build_start=$SECONDS
    # --format docker: the OCI format has no HEALTHCHECK.
    "${podman[@]}" build --pull=never --network=host --format docker --layers -t "$1" "$ROOT" \
        || fail "podman build"
    t "built in $((SECONDS - build_start)) s"
}
