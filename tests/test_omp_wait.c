/* dlrec's default for how OpenMP's idle workers wait (src/cli/main.c): with
 * neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT set, the CLI re-executes itself
 * with OMP_WAIT_POLICY=PASSIVE; a user's setting of either wins and is left
 * as it is (a spin count alone is not overridden by the passive policy). Read from `dlrec -v version`'s debug line, which
 * the re-executed process prints from its own environment. No speed is
 * measured here (bench/threads.sh does that). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

/* Whether `env ENV dlrec -v version`, run with OMP_WAIT_POLICY and
 * GOMP_SPINCOUNT removed first (ctest sets OMP_WAIT_POLICY for every test),
 * prints EXPECT: 1 if it does, 0 if not, -1 if it could not run. */
static int version_says(const char *env, const char *expect) {
  const char *bin = getenv("DLREC_BIN");
  if (!bin) bin = "./dlrec";
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT %s '%s' -v version 2>&1", env, bin);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char *buf = calloc(1, 65536);
  size_t n = buf ? fread(buf, 1, 65535, p) : 0;
  pclose(p);
  if (!buf) return -1;
  buf[n] = '\0';
  int found = strstr(buf, expect) != NULL;
  if (!found) fprintf(stderr, "  `%s` printed:\n%s\n", cmd, buf);
  free(buf);
  return found;
}

TEST(omp_wait_default_is_passive) {
  CHECK_EQ(version_says("", "OpenMP waiting: OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=(unset)\n"), 1);
}

TEST(omp_wait_user_policy_wins) {
  CHECK_EQ(version_says("OMP_WAIT_POLICY=ACTIVE", "OpenMP waiting: OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=(unset)\n"), 1);
  CHECK_EQ(version_says("OMP_WAIT_POLICY=passive", "OpenMP waiting: OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=(unset)\n"),
           1);
}

TEST(omp_wait_user_spincount_wins) {
  CHECK_EQ(version_says("GOMP_SPINCOUNT=123", "OpenMP waiting: OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=123\n"), 1);
}
