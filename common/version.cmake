# Writes OUT = '#define FLX_GIT_DESCRIBE "<git describe of SRC>"' (an empty string outside a git
# checkout), and touches OUT only when the text changed: run at every build by the flx_git_describe
# target, it recompiles common/src/version.c only after a commit or a change of the dirty state.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --tags
                OUTPUT_VARIABLE desc RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0)
  set(desc "")
endif()
string(REGEX REPLACE "[^A-Za-z0-9._+-]" "" desc "${desc}")
set(text "#define FLX_GIT_DESCRIBE \"${desc}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
