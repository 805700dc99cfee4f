# etcd: the conformance suite against one member and against a 3-member
# cluster, plus etcd's own failure cases.
dlock_store_suite(etcd etcd.sh)
dlock_store_suite(etcd3 etcd3.sh)
