# Launch tests, included at the end of tests/CMakeLists.txt: real jobs started the way cluster
# launchers start them (mpirun SPMD and MPMD; Slurm, torchrun and dmlc-tracker environments set
# by hand, since srun/torchrun/dmlc-tracker are not installed here), on loopback only. The
# programs come from examples/ (kv_server, train_mnist) and tests/process/ (dist_smoke,
# placement_smoke); the mpirun tests are skipped when mpirun is not installed.
if(KVSTORE_BUILD_EXAMPLES)
  foreach(mode IN ITEMS mpirun_train mpirun_smoke mpirun_mpmd mpirun_colocated env_slurm env_torchrun
                        env_dmlc)
    # mpirun_train, mpirun_smoke, mpirun_mpmd, mpirun_colocated, launch_env_slurm,
    # launch_env_torchrun, launch_env_dmlc
    if(mode MATCHES "^mpirun_")
      set(_name ${mode})
    else()
      set(_name launch_${mode})
    endif()
    add_test(NAME ${_name}
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/launch_test.sh ${mode}
              $<TARGET_FILE:dist_smoke> $<TARGET_FILE:kv_server> $<TARGET_FILE:train_mnist>
              $<TARGET_FILE:placement_smoke>)
    set_tests_properties(${_name} PROPERTIES TIMEOUT 300 LABELS launch SKIP_RETURN_CODE 77)
  endforeach()
endif()
