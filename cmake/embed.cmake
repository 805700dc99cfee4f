# cmake -DOUT=file.h -DDIR=folder -DNAMES="a.lua;b.sql" -P embed.cmake
#
# Writes OUT: one `#define DLOCK__<EXT>_<NAME> "..."` per DIR/<name>.<ext>
# (a Lua script, an SQL file), as a C string literal. A line
# `--! include x.lua` is replaced by DIR/x.lua (one level); lines that are
# only a comment (`-- ...`) are dropped, so what a server receives is the
# code alone.
function(embed_text path out)
  file(READ ${path} text)
  string(REGEX MATCHALL "--! include [A-Za-z0-9_.]+" incs "${text}")
  foreach(inc ${incs})
    string(REPLACE "--! include " "" f "${inc}")
    file(READ ${DIR}/${f} body)
    string(REPLACE "${inc}\n" "${body}" text "${text}")
  endforeach()
  string(REGEX REPLACE "(^|\n)[ \t]*--[^\n]*" "" text "${text}")
  string(REGEX REPLACE "^\n+" "" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

set(h "/* Generated from ${DIR} by cmake/embed.cmake: do not edit. */\n")
foreach(n ${NAMES})
  embed_text(${DIR}/${n} t)
  string(REPLACE "\\" "\\\\" t "${t}")
  string(REPLACE "\"" "\\\"" t "${t}")
  string(REPLACE "\n" "\\n\" \\\n\t\"" t "${t}")
  string(REGEX REPLACE "^(.*)\\.([a-z]+)$" "\\2_\\1" id ${n})
  string(TOUPPER ${id} id)
  string(APPEND h "#define DLOCK__${id} \\\n\t\"${t}\"\n")
endforeach()
# rewrite only when changed: the stores do not rebuild for nothing
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL h)
  file(WRITE ${OUT} "${h}")
endif()
