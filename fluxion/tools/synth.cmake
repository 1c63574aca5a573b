# flx-synth-calibrate: statistics of a KV dump or a synthetic source (docs/synthetic.md).
add_executable(flx-synth-calibrate synth_calibrate.c)
target_link_libraries(flx-synth-calibrate PRIVATE flx_synth flx_common ${FLX_M_LIB})
