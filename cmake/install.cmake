# cmake --install: the daemon, the tools and the router's Python client fluxion-client (bin/), the libraries (lib/, static archives), the
# public headers with the generated protobuf-c ones (include/), the .proto files and the shipped
# predictor weights (share/fluxion/), and lib/pkgconfig/fluxion.pc. The container images
# (docker/) are built from exactly this tree; tests/install checks it with a program compiled
# against fluxion.pc.
include(GNUInstallDirs)

# Dependents first: the order a static link needs.
set(FLX_INSTALL_LIBS flx_node flx_rpc flx_proto flx_transport flx_decode flx_model_gpu flx_model flx_attn_layer
    flx_predictor flx_features flx_synth flx_fluxion flx_fluxion_kernels flx_kvstore flx_pool flx_cuda_rt flx_common)
set(FLX_INSTALL_TOOLS fluxion-decoded flx-generate flx-gen-ckpt flx-model-dump flx-kv-dump fluxion-attn
    fluxion-demo fluxion-label fluxion-train fluxion-predict flx-synth-calibrate)
foreach(t IN LISTS FLX_INSTALL_TOOLS ITEMS flx_fluxion_train flx-prefill)
  if(TARGET ${t})
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
endforeach()
set(FLX_PC_LIBS "")
foreach(l IN LISTS FLX_INSTALL_LIBS)
  install(TARGETS ${l} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  string(REGEX REPLACE "^flx_" "-lflx_" flag ${l})
  string(APPEND FLX_PC_LIBS "${flag} ")
endforeach()
set(FLX_PC_EXTRA_LIBS "-lxxhash -lm -lpthread")
if(FLX_HAVE_CUDA)
  # the static CUDA runtime (never libcuda): the binaries start on hosts without a driver
  get_target_property(flx_cudart CUDA::cudart_static IMPORTED_LOCATION)
  get_filename_component(flx_cudart_dir "${flx_cudart}" DIRECTORY)
  string(PREPEND FLX_PC_EXTRA_LIBS "-L${flx_cudart_dir} -lcudart_static -ldl -lrt -lstdc++ ")
endif()

foreach(m common kvstore fluxion transport decode)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${m}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(DIRECTORY ${FLX_PROTO_GEN}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.pb-c.h")
# The router's client on python3-grpcio; it finds the .proto files in ../share/fluxion/proto.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/fluxion_client.py DESTINATION ${CMAKE_INSTALL_BINDIR}
        RENAME fluxion-client)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/proto/ DESTINATION ${CMAKE_INSTALL_DATADIR}/fluxion/proto
        FILES_MATCHING PATTERN "*.proto")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/fluxion/weights/ DESTINATION ${CMAKE_INSTALL_DATADIR}/fluxion/weights
        FILES_MATCHING PATTERN "*.safetensors")

configure_file(${PROJECT_SOURCE_DIR}/cmake/fluxion.pc.in ${PROJECT_BINARY_DIR}/fluxion.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/fluxion.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
