# Synthetic workload and KV sources (flx/synth.h, flx/kvsource.h).
flx_add_test(test_synth SOURCES test_synth.c LIBS flx_synth OpenMP::OpenMP_C LABELS unit)
flx_add_test(test_kvdump SOURCES test_kvdump.c LIBS flx_synth LABELS unit)
if(TARGET flx-kv-dump)
  add_executable(test_kvdump_model test_kvdump_model.c)
  target_link_libraries(test_kvdump_model PRIVATE flx_testlib flx_synth flx_model flx_common)
  add_test(NAME test_kvdump_model COMMAND test_kvdump_model $<TARGET_FILE:flx-kv-dump> ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(test_kvdump_model PROPERTIES LABELS model SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "FLX_LOG=error")
  add_dependencies(test_kvdump_model flx-kv-dump)
endif()
