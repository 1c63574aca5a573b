# Synthetic workload and KV sources (flx/synth.h, flx/kvsource.h).
flx_add_test(test_synth SOURCES test_synth.c LIBS flx_synth LABELS unit)
flx_add_test(test_kvdump SOURCES test_kvdump.c LIBS flx_synth LABELS unit ARGS ${CMAKE_CURRENT_BINARY_DIR})
