# redis (and redlock, same client library): the conformance suite against one
# real redis-server, plus the store's own cases.
dlock_store_suite(redis redis.sh)

# The same suite with release=pipelined (releases not waiting for their reply).
dlock_conformance(redis_pipelined FIXTURE server.redis URI_FILE ${DLOCK_SERVER_DIR_redis}/uri
  SUFFIX ?release=pipelined)

# The store's own tests run on a server of their own ("redis-own"): they count
# commands server-wide and kill/restart it, which must not disturb other tests.
set(DLOCK_REDIS_OWN_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-own)
add_test(NAME server.redis-own.start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh start ${DLOCK_REDIS_OWN_DIR})
add_test(NAME server.redis-own.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh stop ${DLOCK_REDIS_OWN_DIR})
set_tests_properties(server.redis-own.start PROPERTIES FIXTURES_SETUP server.redis-own TIMEOUT 120)
set_tests_properties(server.redis-own.stop PROPERTIES FIXTURES_CLEANUP server.redis-own)

# redis_faults: the fault proxy between one client and the server (issue 15);
# redis_keys: the key layout (namespaces never collide) and the notifier.
foreach(t redis_wake redis_crash redis_uri redis_pipeline redis_faults redis_keys)
  add_executable(${t} ${t}.c)
  target_link_libraries(${t} PRIVATE dlock_testutil)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src
                             ${HIREDIS_INCLUDE_DIRS})
  target_compile_definitions(${t} PRIVATE _GNU_SOURCE)
  string(REPLACE "redis_" "redis." tname ${t})
  add_test(NAME ${tname} COMMAND ${t}
    ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh ${DLOCK_REDIS_OWN_DIR})
  set_tests_properties(${tname} PROPERTIES
    FIXTURES_REQUIRED server.redis-own RESOURCE_LOCK server.redis-own
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_REDIS_OWN_DIR}/uri"
    TIMEOUT 120)
endforeach()

# redis.failback (issue 30 row 5): two servers of its own, A and B; B is
# promoted, A resyncs from it and is promoted back (REPLICAOF): fences after
# the failback are above every earlier one (fence_replicas=1&wait_replicas=0).
set(DLOCK_REDIS_PAIR_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-pair)
add_test(NAME server.redis-pair.start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh start ${DLOCK_REDIS_PAIR_DIR} 2)
add_test(NAME server.redis-pair.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh stop ${DLOCK_REDIS_PAIR_DIR})
set_tests_properties(server.redis-pair.start PROPERTIES FIXTURES_SETUP server.redis-pair TIMEOUT 120)
set_tests_properties(server.redis-pair.stop PROPERTIES FIXTURES_CLEANUP server.redis-pair)
add_executable(redis_failback redis_failback.c)
target_link_libraries(redis_failback PRIVATE dlock_testutil)
target_include_directories(redis_failback PRIVATE ${PROJECT_SOURCE_DIR}/tests ${HIREDIS_INCLUDE_DIRS})
target_compile_definitions(redis_failback PRIVATE _GNU_SOURCE)
add_test(NAME redis.failback COMMAND redis_failback
  ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh ${DLOCK_REDIS_PAIR_DIR})
set_tests_properties(redis.failback PROPERTIES
  FIXTURES_REQUIRED server.redis-pair RESOURCE_LOCK server.redis-pair TIMEOUT 120)

# redlock: the same suite against five independent masters.
if(DLOCK_WITH_REDLOCK)
  dlock_store_suite(redlock redlock.sh CHAOS)
  # one server named twice (or by an alias) is refused, not counted twice
  add_executable(redlock_dup redlock_dup.c)
  target_link_libraries(redlock_dup PRIVATE dlock_testutil)
  add_test(NAME redlock.dup COMMAND redlock_dup)
  set_tests_properties(redlock.dup PROPERTIES FIXTURES_REQUIRED server.redlock
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_redlock}/uri" TIMEOUT 60)
endif()

# redlock's failure cases on five masters of their own, with fsync'd AOF
# (killed masters come back with their fence counters).
if(DLOCK_WITH_REDLOCK)
  set(DLOCK_REDLOCK_OWN_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redlock-own)
  add_test(NAME server.redlock-own.start
    COMMAND ${CMAKE_COMMAND} -E env REDIS_PERSIST=1
            bash ${PROJECT_SOURCE_DIR}/tests/servers/redlock.sh start ${DLOCK_REDLOCK_OWN_DIR})
  add_test(NAME server.redlock-own.stop
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redlock.sh stop ${DLOCK_REDLOCK_OWN_DIR})
  set_tests_properties(server.redlock-own.start PROPERTIES FIXTURES_SETUP server.redlock-own TIMEOUT 120)
  set_tests_properties(server.redlock-own.stop PROPERTIES FIXTURES_CLEANUP server.redlock-own)
  add_executable(redlock_faults redlock_faults.c)
  target_link_libraries(redlock_faults PRIVATE dlock_testutil)
  target_include_directories(redlock_faults PRIVATE ${PROJECT_SOURCE_DIR}/tests ${HIREDIS_INCLUDE_DIRS})
  target_compile_definitions(redlock_faults PRIVATE _GNU_SOURCE)
  add_test(NAME redlock.faults COMMAND redlock_faults
    ${PROJECT_SOURCE_DIR}/tests/servers/redlock.sh ${DLOCK_REDLOCK_OWN_DIR})
  set_tests_properties(redlock.faults PROPERTIES
    FIXTURES_REQUIRED server.redlock-own RESOURCE_LOCK server.redlock-own
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_REDLOCK_OWN_DIR}/uri"
    TIMEOUT 300)
endif()

# redlock's undo, repair and restart cases on five masters WITHOUT persistence
# (a restarted master comes back empty: issue 20 row 3, issue 15 row 1).
if(DLOCK_WITH_REDLOCK)
  set(DLOCK_REDLOCK_NP_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redlock-np)
  add_test(NAME server.redlock-np.start
    COMMAND ${CMAKE_COMMAND} -E env --unset=REDIS_PERSIST
            bash ${PROJECT_SOURCE_DIR}/tests/servers/redlock.sh start ${DLOCK_REDLOCK_NP_DIR})
  add_test(NAME server.redlock-np.stop
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redlock.sh stop ${DLOCK_REDLOCK_NP_DIR})
  set_tests_properties(server.redlock-np.start PROPERTIES FIXTURES_SETUP server.redlock-np TIMEOUT 120)
  set_tests_properties(server.redlock-np.stop PROPERTIES FIXTURES_CLEANUP server.redlock-np)
  add_executable(redlock_repair redlock_repair.c)
  target_link_libraries(redlock_repair PRIVATE dlock_testutil)
  target_include_directories(redlock_repair PRIVATE ${PROJECT_SOURCE_DIR}/tests ${HIREDIS_INCLUDE_DIRS})
  target_compile_definitions(redlock_repair PRIVATE _GNU_SOURCE)
  add_test(NAME redlock.repair COMMAND redlock_repair
    ${PROJECT_SOURCE_DIR}/tests/servers/redlock.sh ${DLOCK_REDLOCK_NP_DIR})
  set_tests_properties(redlock.repair PROPERTIES
    FIXTURES_REQUIRED server.redlock-np RESOURCE_LOCK server.redlock-np
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_REDLOCK_NP_DIR}/uri"
    TIMEOUT 300)
  # the same masters through the fault proxy (lost replies, black holes, a slow link)
  add_executable(redlock_net redlock_net.c)
  target_link_libraries(redlock_net PRIVATE dlock_testutil)
  target_include_directories(redlock_net PRIVATE ${PROJECT_SOURCE_DIR}/tests ${HIREDIS_INCLUDE_DIRS})
  target_compile_definitions(redlock_net PRIVATE _GNU_SOURCE)
  add_test(NAME redlock.net COMMAND redlock_net)
  set_tests_properties(redlock.net PROPERTIES
    FIXTURES_REQUIRED server.redlock-np RESOURCE_LOCK server.redlock-np
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_REDLOCK_NP_DIR}/uri"
    TIMEOUT 120)
endif()

# issue 31: a wait through a failover window, and a hung sentinel named
# first (a Sentinel set-up of its own: its master is killed).
set(DLOCK_REDIS_SENTINEL_WAIT_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-sentinel-wait)
add_test(NAME server.redis-sentinel-wait.start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh start ${DLOCK_REDIS_SENTINEL_WAIT_DIR})
add_test(NAME server.redis-sentinel-wait.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh stop ${DLOCK_REDIS_SENTINEL_WAIT_DIR})
set_tests_properties(server.redis-sentinel-wait.start PROPERTIES FIXTURES_SETUP server.redis-sentinel-wait
  TIMEOUT 120)
set_tests_properties(server.redis-sentinel-wait.stop PROPERTIES FIXTURES_CLEANUP server.redis-sentinel-wait)
add_executable(redis_sentinel_wait redis_sentinel_wait.c)
target_link_libraries(redis_sentinel_wait PRIVATE dlock_testutil Threads::Threads)
target_include_directories(redis_sentinel_wait PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src
  ${HIREDIS_INCLUDE_DIRS})
target_compile_definitions(redis_sentinel_wait PRIVATE _GNU_SOURCE)
add_test(NAME redis.sentinel_wait COMMAND redis_sentinel_wait
  ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh ${DLOCK_REDIS_SENTINEL_WAIT_DIR})
set_tests_properties(redis.sentinel_wait PROPERTIES
  FIXTURES_REQUIRED server.redis-sentinel-wait TIMEOUT 120)
# redis+sentinel: master + replica + one Sentinel; the master is killed.
set(DLOCK_REDIS_SENTINEL_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-sentinel)
add_test(NAME server.redis-sentinel.start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh start ${DLOCK_REDIS_SENTINEL_DIR})
add_test(NAME server.redis-sentinel.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh stop ${DLOCK_REDIS_SENTINEL_DIR})
set_tests_properties(server.redis-sentinel.start PROPERTIES FIXTURES_SETUP server.redis-sentinel TIMEOUT 120)
set_tests_properties(server.redis-sentinel.stop PROPERTIES FIXTURES_CLEANUP server.redis-sentinel)
add_executable(redis_sentinel redis_sentinel.c)
target_link_libraries(redis_sentinel PRIVATE dlock_testutil)
target_include_directories(redis_sentinel PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src
                           ${HIREDIS_INCLUDE_DIRS})
target_compile_definitions(redis_sentinel PRIVATE _GNU_SOURCE)
add_test(NAME redis.sentinel COMMAND redis_sentinel
  ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh ${DLOCK_REDIS_SENTINEL_DIR})
set_tests_properties(redis.sentinel PROPERTIES
  FIXTURES_REQUIRED server.redis-sentinel
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_REDIS_SENTINEL_DIR}/uri"
  TIMEOUT 180)

# redis.auth_cli: through the dlock tool, a wrong password exits 69 and no
# output, message or child environment ever shows a password (auth_cli.sh).
if(TARGET dlock_cli)
  add_test(NAME redis.auth_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/auth_cli.sh
           $<TARGET_FILE:dlock_cli> redis ${DLOCK_SERVER_DIR_redis}/uri)
  set_tests_properties(redis.auth_cli PROPERTIES
    FIXTURES_REQUIRED server.redis TIMEOUT 180)
endif()
if(TARGET dlock_cli AND DLOCK_WITH_REDLOCK)
  add_test(NAME redlock.auth_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/auth_cli.sh
           $<TARGET_FILE:dlock_cli> redlock ${DLOCK_SERVER_DIR_redlock}/uri)
  set_tests_properties(redlock.auth_cli PROPERTIES
    FIXTURES_REQUIRED server.redlock TIMEOUT 180)
endif()

# redis.hostile: a fake server in the test answers with huge replies (issue 21 row 4).
add_executable(redis_hostile redis_hostile.c)
target_link_libraries(redis_hostile PRIVATE dlock_testutil Threads::Threads)
target_include_directories(redis_hostile PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src
                           ${HIREDIS_INCLUDE_DIRS})
target_compile_definitions(redis_hostile PRIVATE _GNU_SOURCE)
add_test(NAME redis.hostile COMMAND redis_hostile)
set_tests_properties(redis.hostile PROPERTIES TIMEOUT 120)

# Redis over TLS: four redis-servers with TLS ports and a CA of their own
# (tests/servers/redis-tls.sh); the conformance suite over rediss:// once, and
# redis.tls: trusted, wrong CA, wrong name, expired, mutual TLS, plain TCP to
# a TLS port, bad options, Redlock over TLS, and Sentinel over TLS.
# With a Sentinel set-up of its own over TLS (redis-sentinel.sh, REDIS_TLS=1):
# locks through the sentinels, then a failover.
dlock_store_suite(redis-tls redis-tls.sh)
set(DLOCK_REDIS_SENTINEL_TLS_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-sentinel-tls)
add_test(NAME server.redis-sentinel-tls.start
  COMMAND ${CMAKE_COMMAND} -E env REDIS_TLS=1
          bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh start ${DLOCK_REDIS_SENTINEL_TLS_DIR})
add_test(NAME server.redis-sentinel-tls.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh stop ${DLOCK_REDIS_SENTINEL_TLS_DIR})
set_tests_properties(server.redis-sentinel-tls.start PROPERTIES FIXTURES_SETUP server.redis-sentinel-tls TIMEOUT 180)
set_tests_properties(server.redis-sentinel-tls.stop PROPERTIES FIXTURES_CLEANUP server.redis-sentinel-tls)
add_executable(redis_tls redis_tls.c)
target_link_libraries(redis_tls PRIVATE dlock_testutil Threads::Threads)
add_test(NAME redis.tls COMMAND redis_tls
  ${PROJECT_SOURCE_DIR}/tests/servers/redis-sentinel.sh ${DLOCK_REDIS_SENTINEL_TLS_DIR})
set_tests_properties(redis.tls PROPERTIES
  FIXTURES_REQUIRED "server.redis-tls;server.redis-sentinel-tls" RESOURCE_LOCK server.redis-tls
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_redis-tls}/uri" TIMEOUT 120)
# Redlock over TLS with one master of three trickling or stalled (issue 31 row 4):
# open, a try-once and a held lock's renewals keep their bounds.
add_executable(redlock_tls_slow redlock_tls_slow.c)
target_link_libraries(redlock_tls_slow PRIVATE dlock_testutil Threads::Threads)
add_test(NAME redlock.tls_slow COMMAND redlock_tls_slow)
set_tests_properties(redlock.tls_slow PROPERTIES
  FIXTURES_REQUIRED server.redis-tls
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_redis-tls}/uri" TIMEOUT 60)

# Redis Cluster (issue 19 §2): 3 masters + 3 replicas (tests/servers/redis-cluster.sh).
# The conformance suite over redis+cluster:// (its fault cases put a proxy in
# front of every node: the proxied URI remaps the addresses the nodes
# announce), and on a cluster of its own redis.cluster: names spread over all
# masters, a held lock's slot resharded while renewed, a master killed.
dlock_store_suite(redis-cluster redis-cluster.sh CHAOS
  CHAOS_ENV "DLOCK_TEST_CHAOS_OPTIONS=wait_replicas=0&fence_replicas=0")
set(DLOCK_REDIS_CLUSTER_OWN_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-cluster-own)
add_test(NAME server.redis-cluster-own.start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-cluster.sh start ${DLOCK_REDIS_CLUSTER_OWN_DIR})
add_test(NAME server.redis-cluster-own.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-cluster.sh stop ${DLOCK_REDIS_CLUSTER_OWN_DIR})
set_tests_properties(server.redis-cluster-own.start PROPERTIES FIXTURES_SETUP server.redis-cluster-own TIMEOUT 180)
set_tests_properties(server.redis-cluster-own.stop PROPERTIES FIXTURES_CLEANUP server.redis-cluster-own)
add_executable(redis_cluster redis_cluster.c)
target_link_libraries(redis_cluster PRIVATE dlock_testutil Threads::Threads)
target_include_directories(redis_cluster PRIVATE ${PROJECT_SOURCE_DIR}/tests ${HIREDIS_INCLUDE_DIRS})
target_compile_definitions(redis_cluster PRIVATE _GNU_SOURCE)
add_test(NAME redis.cluster COMMAND redis_cluster
  ${PROJECT_SOURCE_DIR}/tests/servers/redis-cluster.sh ${DLOCK_REDIS_CLUSTER_OWN_DIR}
  spread reshard failback failover)
set_tests_properties(redis.cluster PROPERTIES
  FIXTURES_REQUIRED server.redis-cluster-own RESOURCE_LOCK server.redis-cluster-own TIMEOUT 300)
# issue 31 row 3: a lock's slot moved by hand, slowly, there and back, while
# clients acquire (waiting), hold and release it: every call succeeds in its
# bound, no raw ASK/TRYAGAIN text, one holder at a time, fences only grow.
add_test(NAME redis.cluster_migrate COMMAND redis_cluster
  ${PROJECT_SOURCE_DIR}/tests/servers/redis-cluster.sh ${DLOCK_REDIS_CLUSTER_OWN_DIR} migrate)
set_tests_properties(redis.cluster_migrate PROPERTIES
  FIXTURES_REQUIRED server.redis-cluster-own RESOURCE_LOCK server.redis-cluster-own TIMEOUT 120)
# The same cases over TLS (rediss+cluster://: clients, the cluster bus and
# replication all on TLS ports; redis-cluster.sh with REDIS_TLS=1).
set(DLOCK_REDIS_CLUSTER_TLS_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-cluster-tls)
add_test(NAME server.redis-cluster-tls.start
  COMMAND ${CMAKE_COMMAND} -E env REDIS_TLS=1
          bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-cluster.sh start ${DLOCK_REDIS_CLUSTER_TLS_DIR})
add_test(NAME server.redis-cluster-tls.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis-cluster.sh stop ${DLOCK_REDIS_CLUSTER_TLS_DIR})
set_tests_properties(server.redis-cluster-tls.start PROPERTIES FIXTURES_SETUP server.redis-cluster-tls TIMEOUT 180)
set_tests_properties(server.redis-cluster-tls.stop PROPERTIES FIXTURES_CLEANUP server.redis-cluster-tls)
add_test(NAME redis.cluster_tls COMMAND redis_cluster
  ${PROJECT_SOURCE_DIR}/tests/servers/redis-cluster.sh ${DLOCK_REDIS_CLUSTER_TLS_DIR}
  spread reshard failback failover)
set_tests_properties(redis.cluster_tls PROPERTIES
  FIXTURES_REQUIRED server.redis-cluster-tls RESOURCE_LOCK server.redis-cluster-tls TIMEOUT 300)

# redis.secret (issue 30): passwords with '/', '?', '#', '@' in redis://,
# redlock:// and redis+cluster:// URIs log in (an ACL user of the test on the
# shared servers), and a wrong one is never shown, not even in part.
if(DLOCK_WITH_REDLOCK)
  add_executable(redis_secret redis_secret.c)
  target_link_libraries(redis_secret PRIVATE dlock_testutil)
  target_include_directories(redis_secret PRIVATE ${PROJECT_SOURCE_DIR}/tests ${HIREDIS_INCLUDE_DIRS})
  target_compile_definitions(redis_secret PRIVATE _GNU_SOURCE)
  add_test(NAME redis.secret COMMAND redis_secret ${DLOCK_SERVER_DIR_redis}/uri
           ${DLOCK_SERVER_DIR_redlock}/uri ${DLOCK_SERVER_DIR_redis-cluster}/uri)
  set_tests_properties(redis.secret PROPERTIES
    FIXTURES_REQUIRED "server.redis;server.redlock;server.redis-cluster" TIMEOUT 120)
endif()
