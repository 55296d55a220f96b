#!/bin/sh
# Entrypoint of the rpsagg-server image. With RPSAGG_DECODE_BACKEND=ray and RAY_ADDRESS set
# (the compose file's ray profile), this container first joins the Ray cluster as a node with
# no CPUs of its own: a Ray driver (the server) must run on a node of its cluster, and with
# zero CPUs the decode tasks run on the workers. Then it runs the command (rpsagg-server).
set -e
if [ "${RPSAGG_DECODE_BACKEND:-local}" = ray ] && [ -n "${RAY_ADDRESS:-}" ] \
   && [ "$RAY_ADDRESS" != auto ] && [ "${RAY_ADDRESS#ray://}" = "$RAY_ADDRESS" ]; then
  echo "[entrypoint] joining the Ray cluster at $RAY_ADDRESS as a zero-CPU node" >&2
  ray start --address "$RAY_ADDRESS" --num-cpus 0 --num-gpus 0 --disable-usage-stats >&2
fi
exec "$@"
