/* Training on the files of a followed directory (--follow): each new .dlr
 * file, in name order, as it appears. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "train/trainer_run.h"

/* ---- following a directory ---- */

/* The smallest name after `after` (any, when it is "") of a .dlr file in
 * dir, into out: 1; 0 when there is none; -1 when dir cannot be read. */
static int next_file(const char *dir, const char *after, char *out, size_t n) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int found = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const size_t len = strlen(e->d_name);
    if (len < 5 || len >= n || strcmp(e->d_name + len - 4, ".dlr")) continue;
    if (after[0] && strcmp(e->d_name, after) <= 0) continue;
    if (!found || strcmp(e->d_name, out) < 0) {
      memcpy(out, e->d_name, len + 1);
      found = 1;
    }
  }
  closedir(d);
  return found;
}

/* Opens the loader on the followed directory's file `name` (the run's
 * schema, labeled), which becomes the progress's follow_file. */
dlrec_status run_follow_open(run *r, const char *file) {
  char path[4096], name[sizeof r->prog.follow_file];
  snprintf(name, sizeof name, "%s", file); /* file may be r->prog.follow_file itself */
  dlrec_status s = dlrec_path_join(path, sizeof path, r->a->follow_dir, name);
  const char *paths[] = {path};
  dlrec_loader_close(r->loader);
  r->loader = NULL;
  if (s == DLREC_OK) s = dlrec_loader_open(&r->loader, paths, 1, &r->lo);
  if (s == DLREC_OK && !dlrec_schema_equal(dlrec_loader_schema(r->loader), &r->schema))
    s = dlrec_error(DLREC_ERR_INVALID, "%s: encoded with another ETL state than %s (the schemas differ)", path,
                    r->a->etl_dir);
  if (s == DLREC_OK && !r->schema.has_label) s = dlrec_error(DLREC_ERR_INVALID, "%s: has no labels to train on", path);
  if (s != DLREC_OK) return s;
  snprintf(r->prog.follow_file, sizeof r->prog.follow_file, "%s", name);
  r->follow_rows = dlrec_loader_epoch_rows(r->loader);
  DLREC_INFO("following %s: training on %s (%llu rows)", r->a->follow_dir, name, (unsigned long long)r->follow_rows);
  return DLREC_OK;
}

/* The next batch of the followed directory: from the current file, then
 * from the next file after it as it appears. DLREC_END when the run is to
 * stop: a signal, or follow_idle seconds without a new file. */
dlrec_status run_follow_next(run *r, const dlrec_batch **b) {
  for (;;) {
    if (r->loader) {
      dlrec_status s = dlrec_loader_next(r->loader, b);
      if (s != DLREC_END) return s;
      dlrec_loader_close(r->loader);
      r->loader = NULL;
    }
    char name[sizeof r->prog.follow_file];
    int found;
    const double since = dlrec_now();
    while ((found = next_file(r->a->follow_dir, r->prog.follow_file, name, sizeof name)) == 0) {
      const double waited = dlrec_now() - since;
      if (run_stop_requested(r) || (r->a->follow_idle > 0 && waited >= r->a->follow_idle)) {
        r->follow_idle += waited;
        return DLREC_END;
      }
      usleep(200000);
    }
    r->follow_idle += dlrec_now() - since;
    if (found < 0) return dlrec_error(DLREC_ERR_IO, "--follow %s: %s", r->a->follow_dir, strerror(errno));
    dlrec_status s = run_follow_open(r, name);
    if (s != DLREC_OK) return s;
  }
}
