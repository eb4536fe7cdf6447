/* The pieces under checkpoints, in-process: the run directory's lock. */
#include <unistd.h>

#include "dlrec/fsutil.h"
#include "test.h"

TEST(lock_dir_refuses_a_second_holder_naming_the_pid) {
  const char *dir = test_tmpdir();
  int a = -1, b = -1;
  CHECK_OK(dlrec_lock_dir(dir, "a test", &a));
  CHECK(a >= 0);
  /* flock conflicts between two open files even within one process. */
  char want[64];
  snprintf(want, sizeof want, "in use by a test (pid %ld,", (long)getpid());
  CHECK_ERR(dlrec_lock_dir(dir, "a test", &b), DLREC_ERR_INVALID, want);
  CHECK_EQ(b, -1);
  dlrec_unlock_dir(a);
  CHECK_OK(dlrec_lock_dir(dir, "a test", &b));
  dlrec_unlock_dir(b);
}
