# PostgreSQL: the conformance suite in both modes, plus this store's own tests,
# all against one throwaway cluster that tests/servers/postgres.sh starts
# (fixture server.postgres).
# net_lost_reply's pattern (conformance.c): a try is one statement, the same
# granted or refused, and the only one that carries the waiter's owner
# ("<client id>-<serial>") after the release: table mode's acquire binds
# it, advisory mode's try starts with a "dlock-hold <owner>" comment. A
# blanket drop after the release lost refusals too (a try sent just before
# it), and a client cut off by a drop cannot connect again: it failed 1 run
# in 12 under load. In plain text, so that the proxy reads it (the direct
# client keeps the default TLS).
set(DLOCK_PG_LOST_REPLY "DLOCK_TEST_LOST_REPLY=%s-" "DLOCK_TEST_LOST_REPLY_ARM=release"
  "DLOCK_TEST_LOST_REPLY_OPTION=sslmode=disable")
dlock_store_suite(postgres postgres.sh ENV ${DLOCK_PG_LOST_REPLY})

# The same suite in mode=advisory (same server, URI + "?mode=advisory").
dlock_conformance(postgres_advisory FIXTURE server.postgres URI_FILE ${DLOCK_SERVER_DIR_postgres}/uri
  SUFFIX ?mode=advisory ENV ${DLOCK_PG_LOST_REPLY})

# postgres.advisory: pg_terminate_backend of a holder's connection gives the
# lost signal; a killed holder frees at once; a hung one at idle_session_timeout;
# the advisory key is the documented FNV-1a 64. postgres.clock: a client whose
# clock is 10 days ahead or behind (libfaketime; missing faketime = failure,
# not a skip) cannot change when a table-mode lease ends. postgres.errors: wrong
# password, no server, bad options give EAUTH, EUNAVAILABLE, EINVAL. postgres.wake:
# NOTIFY hands a lock down a chain of waiting threads without polling; a
# release notifies only when a waiter queued behind it, and a release that
# commits while a waiter marks it grants that waiter in the same request.
# postgres.tls: sslmode require / verify-ca / verify-full against the test
# server's own CA, a wrong CA refused, plain connections of a TLS-only role refused.
find_program(FAKETIME faketime)
foreach(t advisory clock errors wake tls session_kill)
  add_executable(postgres_${t} postgres_${t}.c)
  target_link_libraries(postgres_${t} PRIVATE dlock_testutil ${LIBPQ_LINK_LIBRARIES})
  target_include_directories(postgres_${t} PRIVATE ${LIBPQ_INCLUDE_DIRS})
  add_test(NAME postgres.${t} COMMAND postgres_${t} ${FAKETIME})
  set_tests_properties(postgres.${t} PROPERTIES
    FIXTURES_REQUIRED server.postgres TIMEOUT 300
    ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_postgres}/uri")
endforeach()
# Alone: advisory ends every dlock session on the shared server; clock, wake
# and session_kill bound times; tls makes and drops a role that may own the
# shared database's tables (REASSIGN OWNED locks them). errors does none of
# these (a database of its own).
set_tests_properties(postgres.advisory postgres.clock postgres.wake postgres.session_kill postgres.tls
                     PROPERTIES RUN_SERIAL ON)

# postgres.auth_cli: through the dlock tool, a wrong password exits 69 and no
# output, message or child environment ever shows a password (auth_cli.sh).
if(TARGET dlock_cli)
  add_test(NAME postgres.auth_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/stores/auth_cli.sh
           $<TARGET_FILE:dlock_cli> postgres ${DLOCK_SERVER_DIR_postgres}/uri)
  set_tests_properties(postgres.auth_cli PROPERTIES
    FIXTURES_REQUIRED server.postgres TIMEOUT 180)
endif()

# postgres.hang: the store's backends (or the postmaster) stopped with SIGSTOP,
# in both modes: acquire(wait 1000) within 1050 ms, also when the server hangs
# mid-wait; release and status within timeout= + 50 ms, and an unconfirmed
# advisory release closes its session; open within connect_timeout + 50 ms;
# a held lock's on_lost no later than its deadline + 50 ms (scheduling grace) and before another
# client is granted (postgres_hang.c).
add_executable(postgres_hang postgres_hang.c)
target_link_libraries(postgres_hang PRIVATE dlock_testutil ${LIBPQ_LINK_LIBRARIES})
target_include_directories(postgres_hang PRIVATE ${LIBPQ_INCLUDE_DIRS})
add_test(NAME postgres.hang COMMAND postgres_hang)
set_tests_properties(postgres.hang PROPERTIES
  FIXTURES_REQUIRED server.postgres RUN_SERIAL ON TIMEOUT 300
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_postgres}/uri")

# postgres.net: the same bounds through the fault proxy (blackhole), in both
# modes; an unconfirmed advisory release frees the lock with its session;
# table mode: a try whose reply was lost ("drop") and its retry never make
# two holders, fences increase (postgres_net.c).
add_executable(postgres_net postgres_net.c)
target_link_libraries(postgres_net PRIVATE dlock_testutil)
add_test(NAME postgres.net COMMAND postgres_net)
set_tests_properties(postgres.net PROPERTIES
  FIXTURES_REQUIRED server.postgres RUN_SERIAL ON TIMEOUT 300
  ENVIRONMENT "DLOCK_TEST_URI_FILE=${DLOCK_SERVER_DIR_postgres}/uri")
