# Name resolution by the deadline (tests/stores/resolve_hang.c): with a DNS
# that never answers, every store's open returns DLOCK_EUNAVAILABLE within its
# timeout + max(50 ms, 5 %); a /etc/hosts name still opens each running
# server (over TLS, only by a name its certificate carries). Needs root for a private mount namespace: CI runs it as root and a
# namespace that cannot be set up fails there; elsewhere not root = skipped.
add_executable(resolve_hang resolve_hang.c)
target_link_libraries(resolve_hang PRIVATE dlock_testutil Threads::Threads)
target_compile_definitions(resolve_hang PRIVATE _GNU_SOURCE)
target_include_directories(resolve_hang PRIVATE ${PROJECT_SOURCE_DIR}/tests)
set(_resolve_args)
set(_resolve_fixtures)
foreach(s redis redlock etcd etcd_tls zookeeper postgres mysql memcached)
  if(DEFINED DLOCK_SERVER_DIR_${s})
    list(APPEND _resolve_args ${s}=${DLOCK_SERVER_DIR_${s}}/uri)
    list(APPEND _resolve_fixtures server.${s})
  endif()
endforeach()
add_test(NAME resolve.hang COMMAND resolve_hang ${_resolve_args})
set_tests_properties(resolve.hang PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
if(_resolve_fixtures)
  set_tests_properties(resolve.hang PROPERTIES FIXTURES_REQUIRED "${_resolve_fixtures}")
endif()
