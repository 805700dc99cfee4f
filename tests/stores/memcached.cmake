# Memcached: the conformance suite plus this store's own tests against one
# private memcached that tests/servers/memcached.sh starts (fixture server.memcached).
dlock_store_suite(memcached memcached.sh)

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
