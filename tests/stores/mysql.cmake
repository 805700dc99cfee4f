# MySQL/MariaDB: the conformance suite in both modes, plus this store's own tests,
# all against one MariaDB that tests/servers/mysql.sh starts (fixture server.mysql).
# net_lost_reply's pattern (conformance.c): t_acquire sends one batch per
# try, the same text granted or refused, and only an acquire inserts holder
# rows; the first try the proxy reads after the release returned runs after
# it, so it grants (the waiter is alone).
dlock_store_suite(mysql mysql.sh ENV "DLOCK_TEST_LOST_REPLY=INSERT INTO dlock_holder"
  "DLOCK_TEST_LOST_REPLY_ARM=release")

# The same suite once more in mode=get_lock (same server, URI + "?mode=get_lock").
# g_wait blocks in the server's GET_LOCK(key, timeout) and records its grant
# in the same batch; only g_wait sends "@dl_got = GET_LOCK(" (a try sends
# "IF(IS_USED_LOCK..., GET_LOCK(key, 0))").
dlock_conformance(mysql_get_lock FIXTURE server.mysql URI_FILE ${DLOCK_SERVER_DIR_mysql}/uri
  SUFFIX ?mode=get_lock ENV "DLOCK_TEST_LOST_REPLY=@dl_got = GET_LOCK(")

add_executable(mysql_store mysql_store.c)
target_link_libraries(mysql_store PRIVATE dlock_testutil)
target_include_directories(mysql_store PRIVATE ${MARIADB_INCLUDE_DIRS})
add_test(NAME mysql.store COMMAND mysql_store ${PROJECT_SOURCE_DIR}/tests/servers/mysql.sh)
set_tests_properties(mysql.store PROPERTIES
  FIXTURES_REQUIRED server.mysql RUN_SERIAL ON TIMEOUT 300
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_mysql}/uri")

# mysql.session_kill: KILL of a get_lock holder's session fires on_lost at once
# (the held connection's hang-up is watched), not at the next renewal.
add_executable(mysql_session_kill mysql_session_kill.c)
target_link_libraries(mysql_session_kill PRIVATE dlock_testutil)
target_include_directories(mysql_session_kill PRIVATE ${MARIADB_INCLUDE_DIRS})
add_test(NAME mysql.session_kill COMMAND mysql_session_kill)
set_tests_properties(mysql.session_kill PROPERTIES
  FIXTURES_REQUIRED server.mysql RUN_SERIAL ON TIMEOUT 120
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_mysql}/uri")

# A client whose clock is 10 days ahead (libfaketime) cannot take a table-mode
# lock early: expiry is judged only by the server's clock. A missing faketime
# fails the test (FAKETIME-NOTFOUND), it is not skipped.
find_program(FAKETIME faketime)
add_executable(mysql_clock mysql_clock.c)
target_link_libraries(mysql_clock PRIVATE dlock_testutil)
add_test(NAME mysql.clock COMMAND mysql_clock ${FAKETIME})
set_tests_properties(mysql.clock PROPERTIES
  FIXTURES_REQUIRED server.mysql RUN_SERIAL ON TIMEOUT 120
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_mysql}/uri")

# mysql.auth_cli: through the dlock tool, a wrong password exits 69 and no
# output, message or child environment ever shows a password (auth_cli.sh).
if(TARGET dlock_cli)
  add_test(NAME mysql.auth_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/auth_cli.sh
           $<TARGET_FILE:dlock_cli> mysql ${DLOCK_SERVER_DIR_mysql}/uri)
  set_tests_properties(mysql.auth_cli PROPERTIES
    FIXTURES_REQUIRED server.mysql TIMEOUT 180)
endif()

# mysql.net / mysql.net_get_lock: network faults through a fault proxy
# (src/tools/faultproxy.c): bounded acquire wait and release on a black-holed link, the
# lost signal before another client's grant, a granting try whose reply is
# dropped (one holder, fences grow). memcached.cmake builds the same program.
if(NOT TARGET store_net)
  add_executable(store_net mysql_net.c)
  target_link_libraries(store_net PRIVATE dlock_testutil Threads::Threads)
endif()
add_test(NAME mysql.net COMMAND sh -c "exec \"$0\" \"$(cat \"$1\")\"" $<TARGET_FILE:store_net>
         ${DLOCK_SERVER_DIR_mysql}/uri)
add_test(NAME mysql.net_get_lock COMMAND sh -c "exec \"$0\" \"$(cat \"$1\")?mode=get_lock\" session"
         $<TARGET_FILE:store_net> ${DLOCK_SERVER_DIR_mysql}/uri)
set_tests_properties(mysql.net mysql.net_get_lock PROPERTIES
  FIXTURES_REQUIRED server.mysql RUN_SERIAL ON TIMEOUT 120)
