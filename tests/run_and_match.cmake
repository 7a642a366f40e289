# Runs PROGRAM with ARGS (one string, split as a POSIX shell would), showing its output as it
# comes, and fails unless the program exits with EXPECT_EXIT (default 0) AND its output (stdout
# and stderr) matches the regular expression EXPECT. (CTest's PASS_REGULAR_EXPRESSION alone
# ignores the exit status, so a program that printed the expected line and then failed would
# pass.)
#
#   cmake -DPROGRAM=path "-DARGS=--clients 4" "-DEXPECT=regex" [-DEXPECT_EXIT=1] -P run_and_match.cmake
if(NOT DEFINED EXPECT_EXIT)
  set(EXPECT_EXIT 0)
endif()
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${PROGRAM}" ${args}
                RESULT_VARIABLE result
                OUTPUT_VARIABLE output ECHO_OUTPUT_VARIABLE
                ERROR_VARIABLE output ECHO_ERROR_VARIABLE)
if(NOT result STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: exited with status '${result}', not ${EXPECT_EXIT}")
endif()
if(NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: exited ${result} but printed nothing matching '${EXPECT}'")
endif()
