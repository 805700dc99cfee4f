# Installed documentation: the man 3 pages of the public API (written from
# the header comments by scripts/man3.py at build time), the guides under
# share/doc/dlock, and the tool's bash and zsh completion.
find_package(Python3 COMPONENTS Interpreter)
file(GLOB DLOCK_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/include/dlock/*.h
     ${PROJECT_SOURCE_DIR}/include/dlock/sys/*.h)
if(Python3_Interpreter_FOUND)
  set(man3 ${PROJECT_BINARY_DIR}/man3)
  add_custom_command(OUTPUT ${man3}/dlock.3
    COMMAND ${CMAKE_COMMAND} -E rm -rf ${man3}
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/man3.py ${man3} ${PROJECT_VERSION}
            ${DLOCK_PUBLIC_HEADERS}
    DEPENDS ${PROJECT_SOURCE_DIR}/scripts/man3.py ${DLOCK_PUBLIC_HEADERS}
    COMMENT "man 3 pages from the public headers")
  add_custom_target(dlock_man3 ALL DEPENDS ${man3}/dlock.3)
  install(DIRECTORY ${man3}/ DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 FILES_MATCHING PATTERN "*.3")
else()
  message(STATUS "python3 not found: no man 3 pages")
endif()
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md" PATTERN "*.svg")
install(FILES examples/hello.c DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
if(DLOCK_BUILD_CLI)
  install(FILES completion/dlock.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
          RENAME dlock)
  install(FILES completion/_dlock DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions)
endif()
