#!/usr/bin/env bash
# Provides CRIU >= 4.2 at $FORKPOINT_PREFIX/bin/criu without touching the host's libc or apt.
# Uses the host's criu when it is new enough and passes `criu check`; otherwise fetches
# criu and its libraries from Debian testing with a private apt configuration and runs
# them through their own dynamic loader (see shared engine notes).
set -euo pipefail

prefix=${FORKPOINT_PREFIX:-/opt/forkpoint}
wrapper=$prefix/bin/criu
min_major=4 min_minor=2

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

if usable "$wrapper"; then exit 0; fi

mkdir -p "$prefix/bin"
if host_criu=$(command -v criu) && usable "$host_criu"; then
  ln -sf "$host_criu" "$wrapper"
  log "using host criu $("$host_criu" --version | awk '/^Version:/ {print $2}')"
  exit 0
fi

suite=${FORKPOINT_CRIU_SUITE:-testing}
root=$prefix/criu-$suite
apt_dir=$prefix/apt-$suite
rm -rf "$root.new" && mkdir -p "$root.new" "$apt_dir/none" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
cat > "$apt_dir/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${FORKPOINT_DEBIAN_MIRROR:-http://deb.debian.org/debian} $suite main
SRC
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=$apt_dir/none"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::Etc::preferences=/dev/null" -o "Dir::Etc::preferencesparts=$apt_dir/none" -o "APT::Get::List-Cleanup=0")

log "fetching criu from Debian $suite into $root (host apt and libc untouched)"
apt-get -qq "${apt_opts[@]}" update
pkgs=(criu libcompel1 libc6 libgnutls30t64 libnftables1 libnl-3-200 libprotobuf-c1 libnet9 libbsd0
  libuuid1 libnettle8t64 libhogweed6t64 libp11-kit0 libunistring5 libidn2-0 libtasn1-6 libgmp10
  libffi8 libnftnl11 libmnl0 libjansson4 libxtables12 libmd0 libedit2 libtinfo6 zlib1g libzstd1 libcap2)
(cd "$apt_dir/debs" && rm -f ./*.deb && chown _apt "$apt_dir/debs" 2>/dev/null; apt-get -qq "${apt_opts[@]}" download "${pkgs[@]}")
for deb in "$apt_dir"/debs/*.deb; do dpkg -x "$deb" "$root.new"; done
rm -rf "$root" && mv "$root.new" "$root"

loader=
for candidate in "$root"/usr/lib64/ld-linux-x86-64.so.2 "$root"/lib64/ld-linux-x86-64.so.2 \
  "$root"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
  [ -e "$candidate" ] && { loader=$candidate; break; }
done
[ -n "$loader" ] || { log "no dynamic loader found in $root"; exit 1; }
cat > "$wrapper.new" <<WRAP
#!/bin/sh
exec $loader --library-path $root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu $root/usr/sbin/criu "\$@"
WRAP
chmod 755 "$wrapper.new" && mv "$wrapper.new" "$wrapper"

if ! usable "$wrapper"; then
  log "criu from Debian $suite does not pass 'criu check' on this kernel:"
  "$wrapper" check >&2 || true
  exit 1
fi
log "criu $("$wrapper" --version | awk '/^Version:/ {print $2}') ready at $wrapper"
