# Replay of a KV source through the real kvstore (label construction, quality benchmark).
add_library(flx_replay STATIC replay.c)
target_include_directories(flx_replay PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(flx_replay PUBLIC flx_synth flx_features flx_fluxion flx_kvstore flx_common)

add_executable(fluxion-label fluxion_label.c)
target_link_libraries(fluxion-label PRIVATE flx_replay flx_predictor flx_features flx_common)
