#!/usr/bin/env bash
# Does whatever set-up this machine still lacks, and nothing else: system tools, npm packages,
# the TypeScript build, the static agent, CRIU >= 4.2, the default image and the Debian image. Run by
# `./forkpoint` and `npm test`; a second run takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
stamps=$repo/.setup
prefix=${FORKPOINT_PREFIX:-/opt/forkpoint}
mkdir -p "$stamps"

log() { echo "forkpoint setup: $*" >&2; }
die() { echo "forkpoint setup: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "forkpoint runs sandboxes with namespaces, overlay mounts and CRIU, which need root: run this as root (sudo)."
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
grep -qw overlay /proc/filesystems || die "this kernel has no OverlayFS: load the 'overlay' module or use a kernel with CONFIG_OVERLAY_FS."
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$node_major" -ge 20 ] || die "Node.js >= 20 is needed (found: $(node --version 2>/dev/null || echo none))."

# System tools the node needs to run: util-linux, mount's losetup and mkfs.ext4 for disk limits,
# nft and ip for sandboxes' networks, tar for archives, skopeo for pulls from registries; with --test, also what the test suite
# drives (Java, for the OpenAPI 3.0 client generator; a PostgreSQL server, which the store tests
# start as a throwaway cluster; kubectl, which renders the Kubernetes manifests; podman and runc,
# which run the node image as the DaemonSet does; Chromium, which the web console's tests drive;
# a registry (docker-registry, with htpasswd for its credentials) the pull tests push to).
for_tests=0
[ "${1:-}" = "--test" ] && for_tests=1
missing=()
command -v nsenter >/dev/null || missing+=(util-linux)
command -v losetup >/dev/null || missing+=(mount)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v nft >/dev/null || missing+=(nftables)
command -v ip >/dev/null || missing+=(iproute2)
command -v tar >/dev/null || missing+=(tar)
command -v skopeo >/dev/null || missing+=(skopeo)
[ $for_tests = 0 ] || command -v java >/dev/null || missing+=(default-jre-headless)
[ $for_tests = 0 ] || compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)
[ $for_tests = 0 ] || command -v kubectl >/dev/null || missing+=(kubernetes-client)
[ $for_tests = 0 ] || command -v podman >/dev/null || missing+=(podman)
[ $for_tests = 0 ] || command -v runc >/dev/null || missing+=(runc)
[ $for_tests = 0 ] || command -v chromium >/dev/null || missing+=(chromium)
[ $for_tests = 0 ] || command -v docker-registry >/dev/null || missing+=(docker-registry)
[ $for_tests = 0 ] || command -v htpasswd >/dev/null || missing+=(apache2-utils)

install() { # install PACKAGE...: from the distribution's archive, quietly
  log "installing $*"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
[ ${#missing[@]} -eq 0 ] || install "${missing[@]}"
# Debian's docker-registry package starts a registry on port 5000 for everyone where systemd
# runs; the tests start their own on loopback, so the package's is stopped and left off.
if [[ " ${missing[*]} " == *" docker-registry "* ]] && command -v systemctl >/dev/null; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# What building needs (the agent is C linked statically with glibc and libseccomp; npm's native
# modules are C++ built by node-gyp), installed only when something is to be built: a node image
# made from a checkout already built needs no compiler.
build_tools() {
  local tools=()
  command -v cc >/dev/null || tools+=(gcc)
  command -v make >/dev/null || tools+=(make)
  [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/libc.a ] || tools+=(libc6-dev)
  compgen -G '/usr/lib/*/libseccomp.a' >/dev/null || [ -e /usr/lib/libseccomp.a ] || tools+=(libseccomp-dev)
  command -v python3 >/dev/null || tools+=(python3)
  command -v g++ >/dev/null || tools+=(g++)
  [ ${#tools[@]} -eq 0 ] || install "${tools[@]}"
}

newer() { # newer STAMP PATH...: true when any PATH changed since STAMP
  local stamp=$1; shift
  [ -e "$stamp" ] || return 0
  [ -n "$(find "$@" -newer "$stamp" -print -quit 2>/dev/null)" ]
}

# FORKPOINT_SETUP_BUILD=0 (a node image made from a checkout already built: deploy/Containerfile's
# FROM_CHECKOUT) takes the npm packages, the agent and the build as they are, and says if one is missing.
if [ "${FORKPOINT_SETUP_BUILD:-1}" = 0 ]; then
  for built in node_modules native/build/fp-agent dist/cli.js dist/ui/index.html; do
    [ -e "$built" ] || die "FORKPOINT_SETUP_BUILD=0, but $built is missing: build the checkout first (bash deploy/setup.sh)."
  done
else
  if [ ! -d node_modules ] || newer "$stamps/npm" package.json package-lock.json; then
    build_tools
    log "installing npm packages (about a minute the first time; native addons are compiled)"
    # npm ci prints nothing for a minute or more: a line every 15 s says it is still at work.
    ( while sleep 15; do log "  still installing npm packages ($(find node_modules -mindepth 1 -maxdepth 1 2>/dev/null | wc -l) so far)"; done ) &
    ticker=$!
    npm ci --no-audit --no-fund --loglevel=error >&2 || { kill "$ticker" 2>/dev/null; die "npm ci failed"; }
    kill "$ticker" 2>/dev/null || true
    touch "$stamps/npm"
  fi

  if [ ! -x native/build/fp-agent ] || newer native/build/fp-agent native/*.c native/*.h native/Makefile; then
    build_tools
    log "building the agent"
    make -s -C native >&2
  fi

  if [ ! -f dist/cli.js ] || [ ! -f dist/ui/index.html ] || newer "$stamps/build" src ui openapi tsconfig.json package.json scripts/bundle.mjs; then
    log "building TypeScript (the server, and the web console's modules)"
    rm -rf dist
    npx --no-install tsc -p tsconfig.json
    # dist/cli.js as one file: a start no longer reads ~1,750 modules one by one.
    node scripts/bundle.mjs
    # The console's types are the API's, from its OpenAPI document.
    npx --no-install openapi-typescript openapi/openapi.json -o ui/src/openapi.d.ts >/dev/null
    npx --no-install tsc -p ui/tsconfig.json
    npx --no-install vite build --config ui/vite.config.ts
    touch "$stamps/build"
  fi
fi

bash deploy/criu.sh
# A container image build (deploy/Containerfile) leaves the images to the node it runs on:
# FORKPOINT_SETUP_IMAGES=0 stops here.
[ "${FORKPOINT_SETUP_IMAGES:-1}" = 0 ] && exit 0
mkdir -p "$prefix/images"
bash deploy/image.sh "$prefix/images/default"
# Debian stable (apt, curl, git, python3, Node.js), from Debian's archive: about a minute, once.
bash deploy/debian.sh "$prefix/images/debian"
