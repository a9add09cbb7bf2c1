#!/bin/sh
# Makes the certificates of the scaled layout's TLS hop (shims -> gateways,
# mutual TLS), with openssl alone:
#   ca.crt, ca.key          a private CA (keep ca.key offline: it signs both ends)
#   gateway.crt, .key       the gateways' server certificate, valid for every
#                           member's DNS name: *.sandbox-gateway.NAMESPACE.svc.DOMAIN
#                           (sandbox-gateway-0.sandbox-gateway.NAMESPACE.svc.DOMAIN, -1, ...)
#   shim.crt, .key          the shims' client certificate
# then prints the kubectl commands that make the two Secrets the manifests
# mount (sandbox-gateway-tls, sandbox-shim-tls). docs/deploy.md, "TLS between
# shims and gateways".
#
# Usage: make-certs.sh NAMESPACE [CLUSTER_DOMAIN [OUT_DIR]]
#   CLUSTER_DOMAIN: the cluster's DNS domain (default cluster.local)
#   OUT_DIR: where the files go (default: the current directory)
#   DAYS (environment): validity of every certificate (default 365)
set -eu

ns=${1:?usage: make-certs.sh NAMESPACE [CLUSTER_DOMAIN [OUT_DIR]]}
domain=${2:-cluster.local}
out=${3:-.}
days=${DAYS:-365}
# The headless Service of the gateways (gateway-service.yaml).
service=sandbox-gateway
members="*.$service.$ns.svc.$domain"

cd "$out"
umask 077

key() { # name: a P-256 key and a certificate request for CN $2
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
}

sign() { # name, extensions: $1.crt signed by the CA
  printf '%s\n' "$2" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days "$days" -out "$1.crt" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout ca.key -out ca.crt -days "$days" -subj "/CN=sandbox-gateway CA $ns" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

key gateway "$service.$ns.svc.$domain"
sign gateway "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:$members"

key shim "sandbox-shim.$ns"
sign shim "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

rm -f ca.srl
chmod 0644 ca.crt gateway.crt shim.crt

cat <<MSG
Made in $(pwd): ca.crt ca.key gateway.crt gateway.key shim.crt shim.key
(the gateways' certificate is valid for $members). Now:
  kubectl -n $ns create secret generic sandbox-gateway-tls \\
    --from-file=tls.crt=gateway.crt --from-file=tls.key=gateway.key --from-file=ca.crt=ca.crt
  kubectl -n $ns create secret generic sandbox-shim-tls \\
    --from-file=tls.crt=shim.crt --from-file=tls.key=shim.key --from-file=ca.crt=ca.crt
and keep ca.key out of the cluster.
MSG
