#!/usr/bin/env bash
# Builds the `debian` image: Debian stable from Debian's archive by mmdebstrap, with apt working
# and bash, coreutils, ca-certificates, curl, git, jq, sudo, python3 (also as `python`, as E2B's base
# has it; with matplotlib and pandas, for the code interpreter) and Node.js (with Babel, whose TypeScript preset the code interpreter's
# TypeScript cells go through), R and a JDK (the code interpreter's R and Java cells), pip and venv, and E2B's user `user`. Output: a rootfs tree at $1, built
# beside it and renamed into place (a half-built image is never seen). Skipped when the image there was built from this
# package list (its stamp, /etc/forkpoint-image), unless --force: a changed list builds it again.
# The mirror and suite are the host's apt sources' by default (FORKPOINT_DEBIAN_MIRROR,
# FORKPOINT_DEBIAN_SUITE override them).
set -euo pipefail
force=0
[ "${1:-}" = "--force" ] && { force=1; shift; }
dest=${1:?usage: debian.sh [--force] DEST}
pkgs=bash,coreutils,ca-certificates,curl,git,passwd,sudo,python3,python-is-python3,python3-matplotlib,python3-pandas,nodejs,npm,node-babel7,procps,iproute2,less,xz-utils,jq,libnss-myhostname
# E2B's base has a user `user` (uid 1000, home /home/user) whom sudo lets be root without a
# password; its SDKs run commands and write files as that user by default.
users="user:1000:sudo"
# The code interpreter's R and Java (r_kernel.R, JavaKernel.java), and pip and venv (E2B's and
# OpenComputer's sandboxes have them), without what they recommend: R's and pip's recommends
# are a compiler toolchain, R's also ~30 R packages. (The JDK's post-install links its
# manual pages into /usr/share/man/man1, which the image leaves out: the directory is made.)
lean=r-base-core,default-jdk-headless,python3-pip,python3-venv
stamp="packages=$pkgs lean=$lean users=$users"
[ $force = 0 ] && [ -x "$dest/usr/bin/apt-get" ] && [ "$(cat "$dest/etc/forkpoint-image" 2>/dev/null)" = "$stamp" ] && exit 0

log() { echo "forkpoint setup: $*" >&2; }
command -v mmdebstrap >/dev/null || {
  log "installing mmdebstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
}

# The host's own mirror (a Debian host's sources name the one it can reach).
host_mirror() {
  { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}'; awk '/^deb / {print $2}' /etc/apt/sources.list 2>/dev/null; } \
    | grep -v -e security -e '^$' | grep -m1 debian || true
}
mirror=${FORKPOINT_DEBIAN_MIRROR:-$(host_mirror)}
mirror=${mirror:-http://deb.debian.org/debian}
suite=${FORKPOINT_DEBIAN_SUITE:-stable}

mkdir -p "${dest%/*}"
work=$(mktemp -d "${dest%/*}/.debian.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "building the debian image ($suite from $mirror) at $dest; this takes a few minutes once"
start=$(date +%s)
# Hooks: apt's lists are dropped (a sandbox runs apt-get update first, as in a container), and
# the documentation goes, as in Debian's own container images.
mmdebstrap --variant=apt --include="$pkgs" --quiet \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='mkdir -p "$1/usr/share/man/man1"' \
  --customize-hook="chroot \"\$1\" apt-get install -y -q --no-install-recommends ${lean//,/ } > \"\$1/tmp/lean.log\" 2>&1 || { tail -40 \"\$1/tmp/lean.log\"; exit 1; }; rm -f \"\$1/tmp/lean.log\"" \
  --customize-hook='printf "[global]\nbreak-system-packages = true\n" > "$1/etc/pip.conf"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb' \
  --customize-hook='printf "127.0.0.1 localhost\n::1 localhost\n" > "$1/etc/hosts"' \
  --customize-hook="printf '%s\n' '$stamp' > \"\$1/etc/forkpoint-image\"" \
  --customize-hook='printf "PS1=\"\\\\u@\\\\h:\\\\w\\\\$ \"\n" >> "$1/root/.bashrc"' \
  --customize-hook='chroot "$1" /usr/sbin/useradd --create-home --uid 1000 --user-group --shell /bin/bash user' \
  --customize-hook='printf "user ALL=(ALL:ALL) NOPASSWD: ALL\n" > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"' \
  --customize-hook='printf "PS1=\"\\\\u@\\\\h:\\\\w\\\\$ \"\n" >> "$1/home/user/.bashrc"' \
  "$suite" "$work/root" "deb $mirror $suite main" >&2
[ -d "$dest" ] && rm -rf "$dest"
mv "$work/root" "$dest"
log "debian image ready ($(du -sh "$dest" | cut -f1), $(( $(date +%s) - start )) s)"
