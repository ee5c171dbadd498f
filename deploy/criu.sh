#!/usr/bin/env bash
# Provides CRIU >= 4.2 at $FORKPOINT_PREFIX/bin/criu without touching the host's libc.
#
# forkpoint's CRIU is Debian testing's CRIU source with forkpoint's patches (deploy/criu/*.patch,
# each says why), built against the host's libraries: about 30 s, once per patch set. When it
# cannot be built (FORKPOINT_CRIU_BUILD=0, no source, a patch that does not apply to a newer
# CRIU, a failed build), an unpatched CRIU: the host's when it is new enough and passes
# `criu check`, otherwise Debian testing's binaries run through their own dynamic loader (see the
# shared engine notes). The engine works with either; the patches shorten a sandbox's pause.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${FORKPOINT_PREFIX:-/opt/forkpoint}
wrapper=$prefix/bin/criu
# What the CRIU behind the wrapper carries: the patch set's digest, or "unpatched <digest>" once
# building with that patch set failed (not tried again until the patches change).
carries=$wrapper.patches
# Built without GnuTLS (CRIU's TLS page server, which forkpoint does not use): its nine
# libraries' loading and initialisers were ~2 ms of CPU every CRIU process paid at its start,
# one per checkpoint, fork and rollback (3.9 against 2.0 ms a `criu --version` here).
build_flags=(NO_GNUTLS=1)
# The digest covers the build's flags as well: a change of either builds again.
patches=$({ cat deploy/criu/*.patch; echo "${build_flags[*]}"; } | sha256sum | cut -d' ' -f1)
min_major=4 min_minor=2
suite=${FORKPOINT_CRIU_SUITE:-testing}
mirror=${FORKPOINT_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { echo "forkpoint setup: $*" >&2; }

version_ok() { # "Version: 4.2.1" -> ok when >= 4.2
  local v; v=$("$1" --version 2>/dev/null | awk '/^Version:/ {print $2}') || return 1
  local major=${v%%.*} rest=${v#*.}; local minor=${rest%%.*}
  [ -n "$major" ] && { [ "$major" -gt $min_major ] || { [ "$major" -eq $min_major ] && [ "$minor" -ge $min_minor ]; }; }
}

# `criu check` asks the running kernel with the privileges of a runtime, which an image build
# does not have: FORKPOINT_CRIU_CHECK=0 (deploy/Containerfile) checks the version only, and the
# server runs `criu check` when it starts (src/engine/criu.ts).
checked() { [ "${FORKPOINT_CRIU_CHECK:-1}" = 0 ] || "$1" check >/dev/null 2>&1; }
usable() { [ -x "$1" ] && version_ok "$1" && checked "$1"; }

if usable "$wrapper"; then
  case "$(cat "$carries" 2>/dev/null)" in "$patches" | "unpatched $patches") exit 0 ;; esac
  [ "${FORKPOINT_CRIU_BUILD:-1}" = 0 ] && exit 0
fi
mkdir -p "$prefix/bin"

# A private apt configuration for Debian $suite: the host's sources and lists stay as they are.
apt_dir=$prefix/apt-$suite
mkdir -p "$apt_dir/none" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs" "$apt_dir/src"
cat > "$apt_dir/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main
SRC
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=$apt_dir/none"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::Etc::preferences=/dev/null" -o "Dir::Etc::preferencesparts=$apt_dir/none" -o "APT::Get::List-Cleanup=0")
chown -R _apt "$apt_dir/debs" "$apt_dir/src" 2>/dev/null || true
apt_updated=0
suite_update() { [ $apt_updated = 1 ] || { apt-get -qq "${apt_opts[@]}" update && apt_updated=1; }; }

install_as_wrapper() { # install_as_wrapper BINARY CARRIES: the wrapper becomes BINARY, atomically
  ln -sfn "$1" "$wrapper.new" && mv -T "$wrapper.new" "$wrapper"
  echo "$2" > "$carries.new" && mv "$carries.new" "$carries"
}

# Debian's packages CRIU's build needs (its Makefile finds libnftables by pkg-config; without it
# CRIU has no nftables network lock, which the engine asks for).
build_deps=(gcc make pkg-config protobuf-compiler protobuf-c-compiler libprotobuf-dev libprotobuf-c-dev
  libnl-3-dev libnet1-dev libcap-dev libbsd-dev libnftables-dev uuid-dev patch xz-utils)

build_patched() {
  local work=$prefix/criu-build.new dest=$prefix/criu-build-${patches:0:16}
  log "building CRIU from Debian $suite's source with forkpoint's patches (deploy/criu/), once"
  local missing=() p
  for p in "${build_deps[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing CRIU's build dependencies: ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } || return 1
  fi
  suite_update || return 1
  # The source package's .debian.tar may be missing from a partial mirror: only the upstream
  # tarball is built (apt checks each file it fetches against the signed index).
  (cd "$apt_dir/src" && rm -rf ./* && apt-get -qq "${apt_opts[@]}" --download-only source criu >/dev/null 2>&1) || true
  local orig; orig=$(compgen -G "$apt_dir/src/criu_*.orig.tar.*" | head -n1) || true
  [ -n "$orig" ] || { log "no CRIU source from Debian $suite"; return 1; }
  rm -rf "$work" && mkdir -p "$work"
  tar -xf "$orig" -C "$work" --strip-components=1 || return 1
  for p in deploy/criu/*.patch; do
    patch -d "$work" -p1 --forward --batch --quiet < "$p" >&2 || { log "$(basename "$p") does not apply to $(basename "$orig")"; return 1; }
  done
  make -C "$work" -j"$(nproc)" "${build_flags[@]}" criu > "$work.log" 2>&1 || { log "CRIU's build failed; its log: $work.log"; return 1; }
  usable "$work/criu/criu" || { log "the CRIU built does not pass 'criu check'"; return 1; }
  # A new directory per patch set: a server running the old CRIU keeps it until it is replaced.
  mkdir -p "$dest" && cp "$work/criu/criu" "$dest/criu.new" && mv "$dest/criu.new" "$dest/criu"
  rm -rf "$work" "$work.log"
  install_as_wrapper "$dest/criu" "$patches"
  for p in "$prefix"/criu-build-*; do [ "$p" = "$dest" ] || rm -rf "$p"; done
  log "criu $("$wrapper" --version | awk '/^Version:/ {print $2}') with forkpoint's patches ready at $wrapper"
}

if [ "${FORKPOINT_CRIU_BUILD:-1}" != 0 ]; then
  build_patched && exit 0
  rm -rf "$prefix/criu-build.new"
  log "falling back to an unpatched CRIU (the engine works; a sandbox's checkpoint pause is longer)"
fi

if host_criu=$(command -v criu) && usable "$host_criu"; then
  install_as_wrapper "$host_criu" "unpatched $patches"
  log "using host criu $("$host_criu" --version | awk '/^Version:/ {print $2}')"
  exit 0
fi

root=$prefix/criu-$suite
rm -rf "$root.new" && mkdir -p "$root.new"
log "fetching criu from Debian $suite into $root (host apt and libc untouched)"
suite_update
pkgs=(criu libcompel1 libc6 libgnutls30t64 libnftables1 libnl-3-200 libprotobuf-c1 libnet9 libbsd0
  libuuid1 libnettle8t64 libhogweed6t64 libp11-kit0 libunistring5 libidn2-0 libtasn1-6 libgmp10
  libffi8 libnftnl11 libmnl0 libjansson4 libxtables12 libmd0 libedit2 libtinfo6 zlib1g libzstd1 libcap2)
(cd "$apt_dir/debs" && rm -f ./*.deb && apt-get -qq "${apt_opts[@]}" download "${pkgs[@]}")
for deb in "$apt_dir"/debs/*.deb; do dpkg -x "$deb" "$root.new"; done
rm -rf "$root" && mv "$root.new" "$root"

loader=
for candidate in "$root"/usr/lib64/ld-linux-x86-64.so.2 "$root"/lib64/ld-linux-x86-64.so.2 \
  "$root"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
  [ -e "$candidate" ] && { loader=$candidate; break; }
done
[ -n "$loader" ] || { log "no dynamic loader found in $root"; exit 1; }
cat > "$root/criu" <<WRAP
#!/bin/sh
exec $loader --library-path $root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu $root/usr/sbin/criu "\$@"
WRAP
chmod 755 "$root/criu"

if ! usable "$root/criu"; then
  log "criu from Debian $suite does not pass 'criu check' on this kernel:"
  "$root/criu" check >&2 || true
  exit 1
fi
install_as_wrapper "$root/criu" "unpatched $patches"
log "criu $("$wrapper" --version | awk '/^Version:/ {print $2}') ready at $wrapper (unpatched)"
