# flx_predictor: MLP inference (AVX-512/AVX2/scalar, OpenMP), weights and dataset files, selector.
add_library(flx_predictor STATIC src/selector.c)
target_include_directories(flx_predictor PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
                           ${CMAKE_CURRENT_SOURCE_DIR}/../kvstore/include)
target_link_libraries(flx_predictor PUBLIC flx_common OpenMP::OpenMP_C ${FLX_M_LIB})
