# Stage 4 predictor part: MLP inference, weights and dataset files, training, selector.
flx_add_test(test_predictor SOURCES test_predictor.c LIBS flx_predictor LABELS unit)
flx_add_test(test_dataset SOURCES test_dataset.c LIBS flx_predictor LABELS unit)
flx_add_test(test_train SOURCES test_train.c LIBS flx_fluxion_train LABELS unit)
target_include_directories(test_train PRIVATE ${PROJECT_SOURCE_DIR}/fluxion/src)
flx_add_test(test_selector SOURCES test_selector.c LIBS flx_predictor flx_fluxion LABELS unit)
flx_add_test(test_predictor_tools SOURCES test_predictor_tools.c LIBS flx_predictor LABELS unit
             ARGS $<TARGET_FILE:fluxion-train> $<TARGET_FILE:fluxion-predict> ${CMAKE_CURRENT_BINARY_DIR})
add_dependencies(test_predictor_tools fluxion-train fluxion-predict)
flx_add_test(test_calibrate SOURCES test_calibrate.c LIBS flx_predictor LABELS unit)
