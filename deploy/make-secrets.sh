#!/bin/sh
# Makes the files deploy/ mounts as secrets: a private CA, a server certificate it signs, tokens.
#
#   deploy/make-secrets.sh DIR NAME...
#
# NAME: each DNS name (or IP address) clients reach the aggregator by. localhost and 127.0.0.1
# are always added: the health probes ask the aggregator from its own container, pod or host.
# DIR gets these files, owner-only except the two certificates:
#
#   ca.crt            the CA certificate, for every client (--ca-file, VEIL_CA_FILE, ca_file=)
#   ca.key            its key, which signs the next server certificate: keep it off the server
#   server.crt        the aggregator's certificate (EC P-256, 397 days), tls.cert_file
#   server.key        its key, tls.key_file
#   tokens.toml       auth.tokens_file: an upload token "app" (metric "browser": edit to yours)
#                     and the read tokens "dashboard" and "prometheus"
#   prometheus.token  the "prometheus" read token alone, for Prometheus's credentials_file
#
# It overwrites nothing and prints no secret. Needs OpenSSL 1.1.1 or newer.
set -eu

if [ "$#" -lt 2 ]; then
    echo "usage: $0 DIR NAME..." >&2
    exit 2
fi
dir=$1
shift
for file in ca.crt ca.key server.crt server.key tokens.toml prometheus.token; do
    if [ -e "$dir/$file" ]; then
        echo "$0: $dir/$file exists already; move the old files away first." >&2
        exit 1
    fi
done

umask 077
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$work/out
mkdir "$out"

names="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
    case $name in
        *:*) names="$names,IP:$name" ;;          # IPv6
        *[!0-9.]*) names="$names,DNS:$name" ;;
        *) names="$names,IP:$name" ;;            # IPv4
    esac
done

# Explicit configs, so the result does not depend on the system's openssl.cnf.
cat >"$work/ca.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
x509_extensions = ca
[dn]
CN = Veil CA
[ca]
basicConstraints = critical, CA:true, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
cat >"$work/server.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = Veil aggregator
[server]
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = $names
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF

# openssl's chatter goes to a file, shown only when it fails.
quiet() {
    if ! "$@" 2>"$work/log"; then
        cat "$work/log" >&2
        exit 1
    fi
}

newkey="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
# shellcheck disable=SC2086  # $newkey is several arguments
quiet openssl req -x509 -new -config "$work/ca.cnf" $newkey -days 3650 -keyout "$out/ca.key" -out "$out/ca.crt"
# shellcheck disable=SC2086
quiet openssl req -new -config "$work/server.cnf" $newkey -keyout "$out/server.key" -out "$work/server.csr"
quiet openssl x509 -req -in "$work/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 397 -extfile "$work/server.cnf" -extensions server \
    -out "$out/server.crt"
chmod 0644 "$out/ca.crt" "$out/server.crt"

app=$(openssl rand -hex 32)
dashboard=$(openssl rand -hex 32)
prometheus=$(openssl rand -hex 32)
cat >"$out/tokens.toml" <<EOF
# The aggregator's tokens ([auth] tokens_file). Give each app its upload token and each reader
# its read token; only SHA-256 digests of them are kept in the aggregator's memory.
[[upload_tokens]]
name = "app"
token = "$app"
metrics = ["browser"]    # the metrics this app may report

[[read_tokens]]
name = "dashboard"
token = "$dashboard"

[[read_tokens]]
name = "prometheus"
token = "$prometheus"
EOF
printf '%s\n' "$prometheus" >"$out/prometheus.token"

# All or nothing: a failure above puts nothing in DIR.
mv "$out"/* "$dir"/
echo "$dir: ca.crt ca.key server.crt server.key tokens.toml prometheus.token; the certificate names $names"
