#!/usr/bin/env bash
# A test certificate authority, a server certificate and client tokens for rpsagg over TLS
# (README, "Clients on other machines"; docker-compose.tls.yml). Test use only: the CA key is
# kept next to the certificates, everything is valid for DAYS days (default 30).
#
#   scripts/make-test-ca.sh [-o DIR] [-c CLIENT_ID]... [SERVER_NAME_OR_IP]...
#
# Writes into DIR (default ./certs, created with mode 0700):
#   ca.pem, ca.key            the test CA (clients get ca.pem; keep ca.key)
#   server.pem, server.key    server certificate for: server, localhost, 127.0.0.1 and every
#                             SERVER_NAME_OR_IP given (the name or address clients dial)
#   client.token              one token for any client id (compose replicas share it)
#   <CLIENT_ID>.token         per -c: a token valid only for that client id
#   tokens.txt                the server's --tokens file with all of the above
#   admin.token               a token that may create and cancel jobs (rpsagg-jobs)
#   admin-tokens.txt          the server's --admin-tokens file with it
# The files inside DIR are world-readable (0644; ca.key 0600) so that the non-root user of
# the containers can read them when they are mounted one by one as compose secrets; DIR
# itself (0700) keeps them private on this machine.
set -euo pipefail
out=certs
clients=()
days=${DAYS:-30}
while getopts "o:c:h" opt; do
  case "$opt" in
    o) out=$OPTARG ;;
    c) clients+=("$OPTARG") ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; [ "$opt" = h ] && exit 0; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
command -v openssl >/dev/null || { echo "make-test-ca: openssl is required" >&2; exit 1; }
for id in "${clients[@]}"; do
  [[ "$id" =~ ^[A-Za-z0-9._-]{1,128}$ ]] || { echo "make-test-ca: bad client id '$id'" >&2; exit 2; }
done
if [ -e "$out/server.key" ]; then
  echo "make-test-ca: $out/server.key exists; remove $out first" >&2
  exit 1
fi
mkdir -p "$out"
chmod 0700 "$out"

sans="DNS:server,DNS:localhost,IP:127.0.0.1,IP:::1"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then sans+=",IP:$name"; else sans+=",DNS:$name"; fi
done

(
  umask 077
  cd "$out"
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days "$days" \
    -subj "/CN=rpsagg test CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req "${ec[@]}" -keyout server.key -out server.csr -subj "/CN=rpsagg-server" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' \
    "$sans" > server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -days "$days" \
    -set_serial "0x$(openssl rand -hex 16)" -extfile server.ext -out server.pem 2>/dev/null
  rm -f server.csr server.ext

  openssl rand -hex 32 > client.token
  echo "# rpsagg --tokens file: 'TOKEN' (any client id) or 'CLIENT_ID TOKEN'" > tokens.txt
  cat client.token >> tokens.txt
  for id in "${clients[@]}"; do
    openssl rand -hex 32 > "$id.token"
    echo "$id $(cat "$id.token")" >> tokens.txt
  done
  openssl rand -hex 32 > admin.token
  { echo "# rpsagg --admin-tokens file: one token per line (create and cancel jobs)"
    cat admin.token; } > admin-tokens.txt
  chmod 0644 ./*.pem server.key ./*.token tokens.txt admin-tokens.txt
)
echo "make-test-ca: wrote $out/ (server certificate for ${sans//,/, })"
