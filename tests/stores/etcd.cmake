# etcd: the conformance suite against one member and against a 3-member
# cluster, plus etcd's own failure cases.
dlock_store_suite(etcd etcd.sh)
dlock_store_suite(etcd3 etcd3.sh CHAOS)
dlock_store_suite(etcd_tls etcd_tls.sh)

add_executable(etcd_cases etcd_cases.c)
target_link_libraries(etcd_cases PRIVATE dlock_testutil)
target_compile_definitions(etcd_cases PRIVATE
  ETCD_SCRIPT="${PROJECT_SOURCE_DIR}/tests/servers/etcd.sh")
# Killed holder, stopped waiter, watch wake-up, name escaping, mixed TTLs.
add_test(NAME etcd.cases COMMAND etcd_cases single)
set_tests_properties(etcd.cases PROPERTIES
  FIXTURES_REQUIRED server.etcd
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_etcd}/uri"
  TIMEOUT 300 RUN_SERIAL ON)
# These start their own servers: auth gets enabled, a member gets killed.
add_test(NAME etcd.auth COMMAND etcd_cases auth)
add_test(NAME etcd.cluster_failover COMMAND etcd_cases cluster)
add_test(NAME etcd.tls COMMAND etcd_cases tls)
# Issue 31: a stopped member, a killed leader (etcd_cases.c "chaos").
add_test(NAME etcd.chaos COMMAND etcd_cases chaos)
# Alone: the failover and chaos cases bound elections and lost signals in
# time. auth and tls time nothing and share no server: beside others.
set_tests_properties(etcd.cluster_failover etcd.chaos PROPERTIES TIMEOUT 300 RUN_SERIAL ON)
set_tests_properties(etcd.auth etcd.tls PROPERTIES TIMEOUT 300)

# etcd.auth_cli: through the dlock tool, on a member of its own with auth
# enabled: a wrong password exits 69 and no output, message or child
# environment ever shows a password (auth_cli.sh starts and stops the member).
if(TARGET dlock_cli)
  add_test(NAME etcd.auth_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/auth_cli.sh
           $<TARGET_FILE:dlock_cli> etcd -)
  set_tests_properties(etcd.auth_cli PROPERTIES TIMEOUT 180)
endif()

# Network faults on a member of its own: a proxy in the test passes,
# blackholes or drops answers; the member is also paused with SIGSTOP.
add_executable(etcd_net etcd_net.c)
target_link_libraries(etcd_net PRIVATE dlock_testutil)
target_compile_definitions(etcd_net PRIVATE
  ETCD_SCRIPT="${PROJECT_SOURCE_DIR}/tests/servers/etcd.sh")
add_test(NAME etcd.net COMMAND etcd_net)
set_tests_properties(etcd.net PROPERTIES TIMEOUT 300 RUN_SERIAL ON)
target_include_directories(etcd_net PRIVATE ${PROJECT_SOURCE_DIR}/src)

# etcd.etcdctl: recipe=concurrency against `etcdctl lock` (etcd's own
# concurrency.Mutex) on the suite's server (etcd_etcdctl.sh). It counts the
# server's Range/Txn requests while a waiter waits: alone, so that no other
# test's requests on that server are counted.
if(TARGET dlock_cli)
  add_test(NAME etcd.etcdctl COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/etcd_etcdctl.sh
           $<TARGET_FILE:dlock_cli> ${DLOCK_SERVER_DIR_etcd}/uri)
  set_tests_properties(etcd.etcdctl PROPERTIES FIXTURES_REQUIRED server.etcd TIMEOUT 300 RUN_SERIAL ON)
endif()
