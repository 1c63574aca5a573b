# flx_synth: the structured synthetic workload and KV sources / dumps (flx/synth.h, flx/kvsource.h).
add_library(flx_synth STATIC src/synth.c src/kvsource.c)
target_include_directories(flx_synth PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/../kvstore/include)
target_link_libraries(flx_synth PUBLIC flx_pool flx_common ${FLX_M_LIB})
