#!/usr/bin/env bash
# Build a local base image from Debian packages, for hosts that cannot reach a container
# registry: `debootstrap --variant=minbase` into a directory, then `docker import`.
#
#   images/build-base.sh [REPOSITORY]      (default: sandbox-orchestrator/base)
#
# Prints the image reference (REPOSITORY:bookworm-<recipe>) as its last line on stdout.
# Idempotent: the tag carries a hash of this script, so an image built by the same recipe is
# reused. Downloaded .debs are kept in $SANDBOX_BASE_CACHE (default ~/.cache/sandbox-orchestrator/
# debootstrap) so a rebuild does not download them again.
#
# What the image holds: Debian's minbase plus python3 (3.11, the host's major.minor, so the
# wheelhouse built on the host fits) and a developer workbench for the user's own work (docs/
# templates.md): git, curl, wget, build-essential, the usual shell tools, python3 with venv and
# dev headers, and nodejs + npm. The user's python packages (numpy, pandas, matplotlib, ...) come
# from the wheelhouse (images/workbench-requirements.txt): Debian's matplotlib would pull in
# fonttools -> scipy, sympy, pythran and boost (about 700 MB more). pip comes from the wheelhouse
# too. ca-certificates is there for tools that expect its directory; the docker backend still
# mounts the host's bundle read-only over it (docs/egress.md).
set -euo pipefail

REPOSITORY="${1:-sandbox-orchestrator/base}"
SUITE=bookworm
PACKAGES=python3
# Sorted: a change here is a new recipe, so a new image.
APT_PACKAGES="
  build-essential bzip2 ca-certificates curl file git jq less nodejs npm openssh-client
  pkg-config procps psmisc python3-dev python3-venv ripgrep sqlite3 tree unzip wget xz-utils zip
"
MIRROR="${SANDBOX_BASE_MIRROR:-http://deb.debian.org/debian}"
CACHE_DIR="${SANDBOX_BASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-orchestrator/debootstrap}"

# The recipe is this script: any change to it is a new image. The mirror is not part of it.
RECIPE="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
IMAGE="${REPOSITORY}:${SUITE}-${RECIPE}"

say() { echo "build-base: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "reusing $IMAGE (same recipe)"
  echo "$IMAGE"
  exit 0
fi

for tool in debootstrap docker tar; do
  command -v "$tool" >/dev/null 2>&1 || { say "needs '$tool' (apt-get install $tool)"; exit 2; }
done
[ "$(id -u)" = 0 ] || { say "debootstrap needs root"; exit 2; }

ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/sandbox-base.XXXXXX")"
cleanup() { rm -rf --one-file-system "$ROOTFS"; }
trap cleanup EXIT

mkdir -p "$CACHE_DIR"
say "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR into $ROOTFS; .debs cached in $CACHE_DIR"
started=$SECONDS
debootstrap --variant=minbase --include="$PACKAGES" --cache-dir="$CACHE_DIR" \
  "$SUITE" "$ROOTFS" "$MIRROR" \
  | while IFS= read -r line; do
      # One progress line per stage, not one per package.
      case "$line" in I:\ Retrieving*|I:\ Validating*|I:\ Extracting*|I:\ Unpacking\ *|I:\ Configuring\ *) ;; *) say "$line" ;; esac
    done
say "debootstrap took $((SECONDS - started)) s"

# The workbench packages, nodejs and npm among them (skills' npm CLIs install through the egress
# proxy: docs/egress.md). Not through debootstrap --include: its minimal configure pass fails on
# npm's hundreds of node-* packages; apt in the chroot resolves and configures them properly.
# Their .debs are cached beside debootstrap's.
mkdir -p "$CACHE_DIR/apt"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mount -t proc proc "$ROOTFS/proc"
mount --bind "$CACHE_DIR/apt" "$ROOTFS/var/cache/apt/archives"
cleanup() {
  umount "$ROOTFS/var/cache/apt/archives" 2>/dev/null || true
  umount "$ROOTFS/proc" 2>/dev/null || true
  rm -rf --one-file-system "$ROOTFS"
}
chroot "$ROOTFS" apt-get -q update >&2
DEBIAN_FRONTEND=noninteractive chroot "$ROOTFS" apt-get -q -y --no-install-recommends install $APT_PACKAGES >&2
umount "$ROOTFS/var/cache/apt/archives"
umount "$ROOTFS/proc"
: > "$ROOTFS/etc/resolv.conf"
# `git commit` works out of the box: a system-wide fallback identity (the agent's shells set the
# runtime user's own name through GIT_AUTHOR_NAME & co., orchestrator/sandboxes/agent_launch.py).
cat > "$ROOTFS/etc/gitconfig" <<'GITCONFIG'
[user]
	name = Sandbox user
	email = sandbox@users.noreply.invalid
[init]
	defaultBranch = main
[advice]
	detachedHead = false
GITCONFIG
say "apt-get install (workbench packages): done after $((SECONDS - started)) s"

# Trim what a sandbox never uses; keep the package database so `dpkg -l` still tells the truth.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/lib/apt/lists/* \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
       "$ROOTFS"/var/log/*.log "$ROOTFS"/var/cache/debconf/*-old
find "$ROOTFS/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true

say "importing as $IMAGE"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
  --change "LABEL org.sandbox-orchestrator.role=base org.sandbox-orchestrator.recipe=$RECIPE org.sandbox-orchestrator.suite=$SUITE" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$IMAGE" >/dev/null
say "built $IMAGE in $((SECONDS - started)) s"
echo "$IMAGE"
