# zookeeper: the conformance suite against a standalone server and against a
# 3-server ensemble, plus the store's own failure cases on servers of their
# own (they cut connections, stop processes and kill members, which must not
# disturb the conformance runs).
dlock_store_suite(zookeeper zookeeper.sh)
dlock_store_suite(zookeeper3 zookeeper3.sh CHAOS)

set(DLOCK_ZK_OWN_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-zookeeper-own)
set(DLOCK_ZK3_OWN_DIR ${CMAKE_CURRENT_BINARY_DIR}/server-zookeeper3-own)
foreach(f zookeeper-own:zookeeper.sh:${DLOCK_ZK_OWN_DIR} zookeeper3-own:zookeeper3.sh:${DLOCK_ZK3_OWN_DIR})
  string(REPLACE ":" ";" parts ${f})
  list(GET parts 0 fx)
  list(GET parts 1 script)
  list(GET parts 2 dir)
  add_test(NAME server.${fx}.start COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/${script} start ${dir})
  add_test(NAME server.${fx}.stop COMMAND bash ${PROJECT_SOURCE_DIR}/tests/servers/${script} stop ${dir})
  set_tests_properties(server.${fx}.start PROPERTIES FIXTURES_SETUP server.${fx} TIMEOUT 300)
  set_tests_properties(server.${fx}.stop PROPERTIES FIXTURES_CLEANUP server.${fx})
endforeach()

# zookeeper_faults: connection loss around create/delete (a TCP proxy in the
# test), session expiry, a SIGSTOPped holder, digest ACLs, name escaping and
# container cleanup. zookeeper_time: the time bounds of every call and the
# orphan sweep on reconnect, through a proxy that black-holes the link.
# zookeeper_ensemble: kill each member of 3 in turn. zookeeper_chaos: a
# follower SIGSTOPped, fresh opens get a session from the others in time; the
# follower a connected session is on SIGSTOPped, its calls keep their bounds
# and its lock stays held; the leader SIGKILLed (restarted by the test), a
# wait rides the election out.
foreach(t zookeeper_faults:zookeeper-own:zookeeper.sh:${DLOCK_ZK_OWN_DIR}
          zookeeper_time:zookeeper-own:zookeeper.sh:${DLOCK_ZK_OWN_DIR}
          zookeeper_ensemble:zookeeper3-own:zookeeper.sh:${DLOCK_ZK3_OWN_DIR}
          zookeeper_chaos:zookeeper3-own:zookeeper.sh:${DLOCK_ZK3_OWN_DIR})
  string(REPLACE ":" ";" parts ${t})
  list(GET parts 0 exe)
  list(GET parts 1 fx)
  list(GET parts 2 script)
  list(GET parts 3 dir)
  add_executable(${exe} ${exe}.c)
  target_link_libraries(${exe} PRIVATE dlock_testutil ${ZOOKEEPER_MT_LIB} Threads::Threads)
  target_include_directories(${exe} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${ZOOKEEPER_INCLUDE_DIR})
  target_compile_definitions(${exe} PRIVATE _GNU_SOURCE THREADED)
  string(REPLACE "zookeeper_" "zookeeper." tname ${exe})
  add_test(NAME ${tname} COMMAND ${exe} ${PROJECT_SOURCE_DIR}/tests/servers/${script} ${dir})
  set_tests_properties(${tname} PROPERTIES
    FIXTURES_REQUIRED server.${fx} RESOURCE_LOCK server.${fx}
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${dir}/uri"
    TIMEOUT 300)
endforeach()

# zookeeper.auth_cli: through the dlock tool, a wrong password exits 69 and no
# output, message or child environment ever shows a password (auth_cli.sh).
if(TARGET dlock_cli)
  add_test(NAME zookeeper.auth_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/auth_cli.sh
           $<TARGET_FILE:dlock_cli> zookeeper ${DLOCK_SERVER_DIR_zookeeper}/uri)
  set_tests_properties(zookeeper.auth_cli PROPERTIES
    FIXTURES_REQUIRED server.zookeeper TIMEOUT 180)
endif()

# LeakSanitizer: the completion entries libzookeeper_mt loses when a session
# is closed with requests in flight are the library's (zookeeper_lsan.supp).
set(zk_lsan_tests zookeeper.faults zookeeper.time zookeeper.ensemble zookeeper.chaos)
foreach(c ${DLOCK_CONFORMANCE_CASES})
  list(APPEND zk_lsan_tests conformance.zookeeper.${c} conformance.zookeeper3.${c})
endforeach()
foreach(t ${zk_lsan_tests})
  if(TEST ${t})
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT
      "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/zookeeper_lsan.supp")
  endif()
endforeach()

# zookeeper.curator: recipe=curator / curator-rw against Apache Curator's own
# InterProcessMutex and InterProcessReadWriteLock (Java, Debian's
# libcurator-recipes-java) on the suite's server (zookeeper_curator.sh).
if(TARGET dlock_cli)
  add_test(NAME zookeeper.curator COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/zookeeper_curator.sh
           $<TARGET_FILE:dlock_cli> ${DLOCK_SERVER_DIR_zookeeper}/uri)
  # alone: javac and the JVMs would starve other tests' servers of CPU (a
  # 3-member ensemble took over 6 s to elect a leader beside it)
  set_tests_properties(zookeeper.curator PROPERTIES FIXTURES_REQUIRED server.zookeeper
                       TIMEOUT 300 RUN_SERIAL ON)
endif()
