# Limits of one process (tests/stores/limits.c): many distinct locks held and
# renewed, and a crowd of waiters on one lock, on the embedded store and on
# Redis. CI sizes are below the documented full-size runs (docs/limits.md):
# DLOCK_LIMITS_FULL=ON registers the full sizes (100,000 locks; 2,000 waiters).
if(NOT TARGET limits)
  option(DLOCK_LIMITS_FULL "limits tests at full size (100,000 locks, 2,000 waiters)" OFF)
  if(DLOCK_LIMITS_FULL)
    set(DLOCK_LIMITS_MANY 100000)
    set(DLOCK_LIMITS_TTL 10000)
    set(DLOCK_LIMITS_PROCS 200)
  else()
    set(DLOCK_LIMITS_MANY 20000)
    set(DLOCK_LIMITS_TTL 5000)
    set(DLOCK_LIMITS_PROCS 20)
  endif()
  add_executable(limits limits.c)
  target_link_libraries(limits PRIVATE dlock_testutil Threads::Threads)
  target_compile_definitions(limits PRIVATE _GNU_SOURCE)
  if(DLOCK_WITH_SQLITE)
    set(db ${CMAKE_CURRENT_BINARY_DIR}/limits-sqlite.db)
    add_test(NAME limits.sqlite.many COMMAND limits sqlite://${db} many ${DLOCK_LIMITS_MANY} ${DLOCK_LIMITS_TTL})
    add_test(NAME limits.sqlite.waiters COMMAND limits sqlite://${db} waiters ${DLOCK_LIMITS_PROCS} 10)
    set_tests_properties(limits.sqlite.many limits.sqlite.waiters PROPERTIES
      TIMEOUT 600 RUN_SERIAL ON)
  endif()
  if("DLOCK_WITH_REDIS" IN_LIST DLOCK_STORE_DEFS)
    add_test(NAME limits.redis.many COMMAND limits - many ${DLOCK_LIMITS_MANY} ${DLOCK_LIMITS_TTL})
    add_test(NAME limits.redis.waiters COMMAND limits - waiters ${DLOCK_LIMITS_PROCS} 10)
    set_tests_properties(limits.redis.many limits.redis.waiters PROPERTIES
      FIXTURES_REQUIRED server.redis RUN_SERIAL ON TIMEOUT 600
      ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_redis}/uri")
  endif()
endif()
