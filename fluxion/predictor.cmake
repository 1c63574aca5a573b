# flx_predictor: MLP inference (AVX-512/AVX2/scalar, on a worker pool), weights and dataset files, selector.
add_library(flx_predictor STATIC src/selector.c src/predictor.c src/dataset.c src/calibrate.c)
target_include_directories(flx_predictor PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
                           ${CMAKE_CURRENT_SOURCE_DIR}/../kvstore/include)
# The micro-kernels keep register-blocked accumulator arrays: -O3 unrolls them fully (no fast-math).
set_source_files_properties(src/predictor.c PROPERTIES COMPILE_OPTIONS "-O3")
target_link_libraries(flx_predictor PUBLIC flx_pool flx_common ${FLX_M_LIB})

# flx_fluxion_train: training (flx_train), minibatch GEMMs through OpenBLAS.
find_library(FLX_OPENBLAS_LIB openblas REQUIRED)
add_library(flx_fluxion_train STATIC src/train.c)
target_link_libraries(flx_fluxion_train PUBLIC flx_predictor flx_common ${FLX_OPENBLAS_LIB} ${FLX_M_LIB})
