# The device check's host-side tests, included from tests/CMakeLists.txt in builds with the CUDA
# backend.

# The dry run of the real bundle: the bundle builds, stays within 64 MiB, resolves every library
# but the driver and NCCL, and run.sh's preflight passes every check that needs no GPU (bundle
# complete, ldd of every binary and library, the libstdc++/libc symbol versions they need, the
# Python package loads), leaving its log, report and table under $OUT as a GPU run does.
set(GRADSYNC_DEVICE_DRY_OUT ${PROJECT_BINARY_DIR}/device-dry-run)
add_test(NAME "device: the GPU bundle builds within 64 MiB and run.sh accepts it (dry run)"
  COMMAND sh -c "rm -rf '${GRADSYNC_DEVICE_DRY_OUT}' && \
${PROJECT_SOURCE_DIR}/tests/device/bundle.sh ${PROJECT_BINARY_DIR} ${PROJECT_BINARY_DIR}/device-bundle-check && \
OUT='${GRADSYNC_DEVICE_DRY_OUT}' bash ${PROJECT_BINARY_DIR}/device-bundle-check/run.sh ${PROJECT_BINARY_DIR}/device-bundle-check --dry-run && \
test -s '${GRADSYNC_DEVICE_DRY_OUT}/run.log' && test -s '${GRADSYNC_DEVICE_DRY_OUT}/preflight.txt' && \
test -s '${GRADSYNC_DEVICE_DRY_OUT}/table.json' && grep -q '^ok    symbol-versions' '${GRADSYNC_DEVICE_DRY_OUT}/preflight.txt' && \
grep -q '^ok    ldd' '${GRADSYNC_DEVICE_DRY_OUT}/preflight.txt' && \
test -s '${GRADSYNC_DEVICE_DRY_OUT}/device-out.tar.gz' && test $(find '${GRADSYNC_DEVICE_DRY_OUT}' -type f | wc -l) -le 8")
set_tests_properties("device: the GPU bundle builds within 64 MiB and run.sh accepts it (dry run)" PROPERTIES TIMEOUT 120)

# run.sh itself, against a fake bundle (fake_bundle.sh: stubs, a fake nvidia-smi and NCCL
# wheel), so that every layer of it runs here: the whole table and every daemon's log; a stage
# that hangs, cut at its budget; a hang only the overall bound can end (and one where run.sh's
# trap hangs too), which must still print and save the table within the bound; a preflight that
# stops the run; a SIGTERM to run.sh mid-stage. test_run.sh describes each case.
foreach(case pass hang bound trap-stuck preflight-stops interrupt)
  add_test(NAME "device: run.sh with a fake bundle: ${case}"
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/device/test_run.sh ${case} ${PROJECT_BINARY_DIR}/device-run-tests/${case})
  # Timing is what these check: not beside other tests on a loaded machine.
  set_tests_properties("device: run.sh with a fake bundle: ${case}" PROPERTIES TIMEOUT 120 RUN_SERIAL TRUE)
endforeach()
