# flx_features: the 41 head features, prefill statistics, least budgets and labels (flx/features.h,
# flx/budget.h). Pure C over views and raw arrays; features_session.c reads the kvstore.
add_library(flx_features STATIC src/features.c src/budget.c src/features_session.c)
target_include_directories(flx_features PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_link_libraries(flx_features PUBLIC flx_fluxion flx_kvstore flx_common ${FLX_M_LIB})
