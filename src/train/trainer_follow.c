/* Training on the files of a followed directory (--follow): each new .dlr
 * file, in name order, as it appears. A file is checked whole before its
 * first step; one its writer has not finished is waited for, and a bad one
 * is moved aside into DIR/.rejected/ with the reason (or, --follow-strict,
 * stops the run), so that one bad file does not stop a continuous trainer. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "data/dlr.h"
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

/* Checks the file at path whole, as the loader would only find out row
 * group by row group (a run must not train half a file and then stop or
 * skip the rest): a regular file (a symlink to one too), a .dlr file whose
 * every row group's checksum and ids hold, the run's schema, labeled.
 * *bad: the error is the file's (its bytes or kind), not the machine's (an
 * I/O error, memory), and the file is to be moved aside. */
static dlrec_status check_file(const run *r, const char *path, int *bad) {
  struct stat st, lst;
  *bad = 1;
  if (stat(path, &st) != 0) {
    const int e = errno;
    if ((e == ENOENT || e == ELOOP || e == ENOTDIR) && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
      return dlrec_error(DLREC_ERR_INVALID, "%s: a symbolic link to no file (%s)", path, strerror(e));
    *bad = 0;
    return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) return dlrec_error(DLREC_ERR_INVALID, "%s: not a regular file, not a .dlr file", path);
  dlrec_dlr *f;
  dlrec_status s = dlrec_dlr_open(&f, path);
  for (uint32_t g = 0; s == DLREC_OK && g < dlrec_dlr_row_groups(f); g++) s = dlrec_dlr_verify(f, g);
  if (s == DLREC_OK && !dlrec_schema_equal(dlrec_dlr_schema(f), &r->schema))
    s = dlrec_error(DLREC_ERR_INVALID, "%s: encoded with another ETL state than %s (the schemas differ)", path,
                    r->a->etl_dir);
  if (s == DLREC_OK && !dlrec_dlr_schema(f)->has_label)
    s = dlrec_error(DLREC_ERR_INVALID, "%s: has no labels to train on", path);
  dlrec_dlr_close(f);
  *bad = s == DLREC_ERR_CORRUPT || s == DLREC_ERR_VERSION || s == DLREC_ERR_INVALID;
  return s;
}

/* Renames src to dst unless dst exists: 0, or -1 with errno (EEXIST when
 * taken). Where the kernel or file system cannot say so atomically, a
 * look first (the race left is another follower of DIR choosing the same
 * name for another file in the same instant). */
static int rename_noreplace(const char *src, const char *dst) {
#ifdef RENAME_NOREPLACE
  if (renameat2(AT_FDCWD, src, AT_FDCWD, dst, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
#endif
  struct stat st;
  if (lstat(dst, &st) == 0) return errno = EEXIST, -1;
  return rename(src, dst);
}

/* Moves DIR/name into DIR/.rejected/ under its name (NAME.1, NAME.2, ...
 * when taken: nothing there is replaced) with NAME.reason beside it holding
 * `why`. rename moves a symlink itself, never its target; nothing is
 * deleted. A file gone meanwhile (its producer took it back) is let be. */
static dlrec_status reject_file(run *r, const char *name, const char *why) {
  char dir[4096], src[4096], dst[4200], reason[4300];
  dlrec_status s = dlrec_path_join(dir, sizeof dir, r->a->follow_dir, ".rejected");
  if (s == DLREC_OK) s = dlrec_path_join(src, sizeof src, r->a->follow_dir, name);
  if (s != DLREC_OK) return s;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) return dlrec_error(DLREC_ERR_IO, "%s: %s", dir, strerror(errno));
  int rc = -1;
  for (unsigned k = 0; k < 1000 && rc != 0; k++) {
    snprintf(dst, sizeof dst, k ? "%s/%s.%u" : "%s/%s", dir, name, k);
    if ((rc = rename_noreplace(src, dst)) != 0 && errno != EEXIST) break;
  }
  if (rc != 0 && errno == ENOENT) {
    DLREC_WARN("following %s: %s is gone: %s", r->a->follow_dir, name, why);
    return DLREC_OK;
  }
  if (rc != 0) return dlrec_error(DLREC_ERR_IO, "--follow: cannot move %s into %s: %s (it was rejected: %s)", src, dir,
                                  strerror(errno), why);
  r->files_rejected++;
  DLREC_WARN("following %s: rejected %s, moved to %s: %s", r->a->follow_dir, name, dst, why);
  snprintf(reason, sizeof reason, "%s.reason", dst);
  char text[1100];
  const int n = snprintf(text, sizeof text, "%s\n", why);
  s = dlrec_write_file_atomic(reason, text, n < (int)sizeof text ? (size_t)n : sizeof text - 1);
  if (s == DLREC_OK) s = dlrec_fsync_dir(r->a->follow_dir);
  return s;
}

/* Takes the followed directory's file `name`: waits while its writer has
 * not finished it (up to follow_wait seconds), checks it and opens its
 * loader. A bad file is moved aside (r->loader stays NULL: the caller goes
 * on to the next); with --follow-strict its error stops the run. DLREC_END:
 * a stop was requested while waiting. */
static dlrec_status take_file(run *r, const char *name) {
  char path[4096];
  dlrec_status s = dlrec_path_join(path, sizeof path, r->a->follow_dir, name);
  if (s != DLREC_OK) return s;
  const double wait = r->a->follow_wait > 0 ? r->a->follow_wait : DLREC_FOLLOW_WAIT_DEFAULT, since = dlrec_now();
  int unfinished, said = 0, bad = 0;
  while ((unfinished = dlrec_dlr_unfinished(path)) && dlrec_now() - since < wait && !run_stop_requested(r)) {
    if (!said++) /* a warning: producers are to write NAME.dlr.tmp and rename it when finished */
      DLREC_WARN("following %s: waiting up to %g s for the writer of %s to finish it", r->a->follow_dir, wait, name);
    usleep(100000);
  }
  r->follow_idle += dlrec_now() - since;
  if (unfinished && run_stop_requested(r)) return DLREC_END;
  if (unfinished)
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: incomplete after %g s: its writer has not finished it (the header's "
                    "complete flag is unset, or the file is shorter than its header says; --follow-wait)", path, wait);
  else
    s = check_file(r, path, &bad);
  if (s == DLREC_OK) return run_follow_open(r, name);
  if (r->a->follow_strict || (!unfinished && !bad)) return s;
  char why[1024];
  snprintf(why, sizeof why, "%s", dlrec_last_error());
  return reject_file(r, name, why);
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
    dlrec_status s = take_file(r, name);
    if (s != DLREC_OK) return s;
  }
}
