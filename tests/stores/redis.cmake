# redis (and redlock, same client library): the conformance suite against one
# real redis-server, plus the store's own cases.
dlock_store_suite(redis redis.sh)

# The store's own tests run on a server of their own ("redis-own"): they count
# commands server-wide and kill/restart it, which must not disturb other tests.
set(DLOCK_REDIS_OWN_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-redis-own)
add_test(NAME server.redis-own.start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh start ${DLOCK_REDIS_OWN_DIR})
add_test(NAME server.redis-own.stop
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh stop ${DLOCK_REDIS_OWN_DIR})
set_tests_properties(server.redis-own.start PROPERTIES FIXTURES_SETUP server.redis-own TIMEOUT 120)
set_tests_properties(server.redis-own.stop PROPERTIES FIXTURES_CLEANUP server.redis-own)

foreach(t redis_wake redis_crash)
  add_executable(${t} ${t}.c)
  target_link_libraries(${t} PRIVATE dlock_testutil)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${HIREDIS_INCLUDE_DIRS})
  target_compile_definitions(${t} PRIVATE _GNU_SOURCE)
  string(REPLACE "redis_" "redis." tname ${t})
  add_test(NAME ${tname} COMMAND ${t}
    ${PROJECT_SOURCE_DIR}/tests/servers/redis.sh ${DLOCK_REDIS_OWN_DIR})
  set_tests_properties(${tname} PROPERTIES
    FIXTURES_REQUIRED server.redis-own RESOURCE_LOCK server.redis-own
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_REDIS_OWN_DIR}/uri"
    TIMEOUT 120)
endforeach()
