# Stage 4 predictor tools: training from label datasets, evaluation of shipped weights.
add_executable(fluxion-train fluxion_train.c)
target_link_libraries(fluxion-train PRIVATE flx_fluxion_train flx_predictor flx_common)
add_executable(fluxion-predict fluxion_train.c)
target_compile_definitions(fluxion-predict PRIVATE FLX_PREDICT_TOOL=1)
target_link_libraries(fluxion-predict PRIVATE flx_fluxion_train flx_predictor flx_common)
