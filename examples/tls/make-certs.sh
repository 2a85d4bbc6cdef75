#!/usr/bin/env bash
# Demo certificates for examples/hotproxy.toml: a CA, two server
# certificates (a.example.com; *.example.org) and a client certificate.
# They are public, in the repository: never use them for anything real.
# Run again to make new ones: ./make-certs.sh
set -euo pipefail
cd "$(dirname "$0")"
days=36500
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -days $days -subj "/CN=hotproxy demo CA" -out ca.pem \
	-addext basicConstraints=critical,CA:true -addext keyUsage=critical,keyCertSign,cRLSign
leaf() { # name, subject CN, extensions
	key "$1.key"
	openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
	openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days $days -out "$1.pem" \
		-extfile <(printf '%s\n' "$3") 2>/dev/null
	rm -f "$1.csr"
}
leaf a.example.com a.example.com "subjectAltName=DNS:a.example.com
extendedKeyUsage=serverAuth"
leaf wildcard.example.org '*.example.org' "subjectAltName=DNS:*.example.org
extendedKeyUsage=serverAuth"
leaf client "hotproxy client" "extendedKeyUsage=clientAuth"
rm -f ca.srl ca.key
chmod 0644 ./*.pem ./*.key
