#!/usr/bin/env bash
# One etcd member that clients reach over TLS with client certificates
# (etcd.sh with DLOCK_ETCD_TLS=1; the URI is etcds://...?cacert&cert&key).
DLOCK_ETCD_TLS=1 exec bash "$(cd "$(dirname "$0")" && pwd)/etcd.sh" "${1:?usage: etcd_tls.sh start|stop DIR}" "${2:?usage: etcd_tls.sh start|stop DIR}"
