# Memcached: the conformance suite plus this store's own tests against one
# private memcached that tests/servers/memcached.sh starts (fixture server.memcached).
# net_lost_reply drops the answers from the grant's write on: the cas (or
# add) of the holder list with a line "H <owner> ..." (owner = "<client
# id>-<serial>"); a waiter's own writes only ever add a "Q" line.
dlock_store_suite(memcached memcached.sh ENV "DLOCK_TEST_LOST_REPLY=\\nH %s-")

add_executable(memcached_store memcached_store.c)
target_link_libraries(memcached_store PRIVATE dlock_testutil ${MEMCACHED_LINK_LIBRARIES})
target_include_directories(memcached_store PRIVATE ${MEMCACHED_INCLUDE_DIRS})
add_test(NAME memcached.store COMMAND memcached_store)
set_tests_properties(memcached.store PROPERTIES
  FIXTURES_REQUIRED server.memcached RUN_SERIAL ON TIMEOUT 300
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_memcached}/uri")

# memcached.net: the network faults of mysql.net (same program, mysql_net.c)
# through a fault proxy in front of this memcached.
if(NOT TARGET store_net)
  add_executable(store_net mysql_net.c)
  target_link_libraries(store_net PRIVATE dlock_testutil Threads::Threads)
endif()
add_test(NAME memcached.net COMMAND sh -c "exec \"$0\" \"$(cat \"$1\")\"" $<TARGET_FILE:store_net>
         ${DLOCK_SERVER_DIR_memcached}/uri)
set_tests_properties(memcached.net PROPERTIES
  FIXTURES_REQUIRED server.memcached RUN_SERIAL ON TIMEOUT 120)

# memcached.evict (issue 30 row 4): a memcached of 2 MB that evicts (no -M),
# filled far past it while a lock is held: no silent second holder.
set(DLOCK_MC_EVICT_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-memcached-evict)
add_test(NAME server.memcached-evict.start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/memcached.sh start ${DLOCK_MC_EVICT_DIR} 2)
add_test(NAME server.memcached-evict.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/memcached.sh stop ${DLOCK_MC_EVICT_DIR})
set_tests_properties(server.memcached-evict.start PROPERTIES FIXTURES_SETUP server.memcached-evict)
set_tests_properties(server.memcached-evict.stop PROPERTIES FIXTURES_CLEANUP server.memcached-evict)
add_executable(memcached_evict memcached_evict.c)
target_link_libraries(memcached_evict PRIVATE dlock_testutil ${MEMCACHED_LINK_LIBRARIES})
target_include_directories(memcached_evict PRIVATE ${MEMCACHED_INCLUDE_DIRS})
add_test(NAME memcached.evict COMMAND memcached_evict)
set_tests_properties(memcached.evict PROPERTIES
  FIXTURES_REQUIRED server.memcached-evict TIMEOUT 120
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_MC_EVICT_DIR}/uri")
