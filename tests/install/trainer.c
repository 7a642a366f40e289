/* A tiny trainer built against the installed gradsync package (tests/install/check.sh): joins a
 * one-rank job on the daemon at argv[1], sums four floats, and checks them. Exit 0 on success. */
#include <gradsync/c_api.h>
#include <stdio.h>

static int failed(const char* what) {
  fprintf(stderr, "trainer: %s: %s\n", what, gs_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  gs_client* client = NULL;
  if (gs_connect(argv[1], "install-test", 0, &client) != GS_OK) return failed("connect");
  if (gs_join(client, "install-test", 0, 1, 0, 1, 0, NULL, NULL, 0) != GS_OK) return failed("join");
  float* data = NULL;
  if (gs_alloc(client, 4 * sizeof(float), -1, (void**)&data) != GS_OK) return failed("alloc");
  for (int i = 0; i < 4; ++i) data[i] = (float)(i + 1);
  gs_tensor tensor = {data, 4, GS_FLOAT32, -1, NULL};
  gs_set* set = NULL;
  if (gs_register(client, &tensor, 1, -1, 0, &set) != GS_OK) return failed("register");
  gs_reduce_options options = {GS_SUM, 0, 0.0, 1};
  gs_work* work = NULL;
  if (gs_allreduce(client, set, &options, &work) != GS_OK) return failed("allreduce");
  int32_t completed = 0;
  if (gs_work_wait(work, 10000, &completed) != GS_OK || !completed) return failed("wait");
  for (int i = 0; i < 4; ++i) {
    if (data[i] != (float)(i + 1)) return failed("result"); /* one rank: the sum is the input */
  }
  gs_work_free(work);
  gs_set_free(set);
  gs_client_close(client);
  printf("trainer: ok (C API %d)\n", gs_c_api_version());
  return 0;
}
