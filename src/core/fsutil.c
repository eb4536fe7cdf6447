/* File helpers with errors that name the path. */
#include "core/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

dlrec_status dlrec_read_file(const char *path, size_t max_bytes, char **out, size_t *n) {
  *out = NULL;
  *n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return dlrec_error(DLREC_ERR_IO, "%s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > max_bytes) {
    close(fd);
    return dlrec_error(DLREC_ERR_INVALID, "%s: %lld bytes is more than the limit of %zu", path,
                       (long long)st.st_size, max_bytes);
  }
  char *buf = malloc((size_t)st.st_size + 1);
  if (!buf) {
    close(fd);
    return dlrec_error(DLREC_ERR_NOMEM, "%s: cannot allocate %lld bytes", path, (long long)st.st_size);
  }
  size_t got = 0;
  dlrec_status s = dlrec_read_full(fd, buf, (size_t)st.st_size, &got, path);
  close(fd);
  if (s != DLREC_OK) {
    free(buf);
    return s;
  }
  buf[got] = '\0';
  *out = buf;
  *n = got;
  return DLREC_OK;
}

dlrec_status dlrec_write_all(int fd, const void *buf, size_t n, const char *path) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return dlrec_error(DLREC_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    p += w;
    n -= (size_t)w;
  }
  return DLREC_OK;
}

dlrec_status dlrec_pwrite_all(int fd, const void *buf, size_t n, uint64_t offset, const char *path) {
  const char *p = buf;
  while (n) {
    ssize_t w = pwrite(fd, p, n, (off_t)offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return dlrec_error(DLREC_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    p += w;
    n -= (size_t)w;
    offset += (uint64_t)w;
  }
  return DLREC_OK;
}

dlrec_status dlrec_pread_all(int fd, void *buf, size_t n, uint64_t offset, const char *path) {
  char *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return dlrec_error(DLREC_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (r == 0)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: truncated at offset %llu", path, (unsigned long long)offset);
    p += r;
    n -= (size_t)r;
    offset += (uint64_t)r;
  }
  return DLREC_OK;
}

dlrec_status dlrec_read_full(int fd, void *buf, size_t n, size_t *got, const char *path) {
  char *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t r = read(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return dlrec_error(DLREC_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    }
    if (r == 0) break;
    done += (size_t)r;
  }
  *got = done;
  return DLREC_OK;
}

dlrec_status dlrec_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", dir, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  /* Some file systems refuse fsync on directories; that is not data loss. */
  if (rc != 0 && err != EINVAL && err != EROFS)
    return dlrec_error(DLREC_ERR_IO, "%s: fsync failed: %s", dir, strerror(err));
  return DLREC_OK;
}

dlrec_status dlrec_rename_durable(const char *tmp, const char *path) {
  if (rename(tmp, path) != 0)
    return dlrec_error(DLREC_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
  char *copy = strdup(path);
  if (!copy) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  dlrec_status s = dlrec_fsync_dir(dirname(copy));
  free(copy);
  return s;
}

dlrec_status dlrec_write_file_atomic(const char *path, const void *data, size_t n) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return dlrec_error(DLREC_ERR_INVALID, "%s: path too long", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", tmp, strerror(errno));
  dlrec_status s = dlrec_write_all(fd, data, n, tmp);
  if (s == DLREC_OK && fsync(fd) != 0) s = dlrec_error(DLREC_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
  if (close(fd) != 0 && s == DLREC_OK) s = dlrec_error(DLREC_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
  if (s == DLREC_OK) s = dlrec_rename_durable(tmp, path);
  if (s != DLREC_OK) unlink(tmp);
  return s;
}

dlrec_status dlrec_mkdirs(const char *path) {
  char buf[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return dlrec_error(DLREC_ERR_INVALID, "bad directory path '%s'", path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == '\0') {
      char c = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return dlrec_error(DLREC_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
      buf[i] = c;
    }
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return dlrec_error(DLREC_ERR_IO, "%s: exists and is not a directory", path);
  return DLREC_OK;
}

dlrec_status dlrec_path_join(char *out, size_t out_size, const char *dir, const char *name) {
  int n = snprintf(out, out_size, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= out_size) return dlrec_error(DLREC_ERR_INVALID, "path too long: %s/%s", dir, name);
  return DLREC_OK;
}

dlrec_status dlrec_copy_file(const char *src, const char *dst) {
  int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", src, strerror(errno));
  int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    close(in);
    return dlrec_error(DLREC_ERR_IO, "%s: %s", dst, strerror(errno));
  }
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  dlrec_status s = buf ? DLREC_OK : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  while (s == DLREC_OK) {
    size_t got = 0;
    s = dlrec_read_full(in, buf, CHUNK, &got, src);
    if (s != DLREC_OK || got == 0) break;
    s = dlrec_write_all(out, buf, got, dst);
  }
  free(buf);
  if (s == DLREC_OK && fsync(out) != 0) s = dlrec_error(DLREC_ERR_IO, "%s: fsync failed: %s", dst, strerror(errno));
  close(in);
  if (close(out) != 0 && s == DLREC_OK) s = dlrec_error(DLREC_ERR_IO, "%s: close failed: %s", dst, strerror(errno));
  return s;
}

dlrec_status dlrec_remove_tree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? DLREC_OK : dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
    struct dirent *e;
    dlrec_status s = DLREC_OK;
    while (s == DLREC_OK && (e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char sub[4096];
      s = dlrec_path_join(sub, sizeof sub, path, e->d_name);
      if (s == DLREC_OK) s = dlrec_remove_tree(sub);
    }
    closedir(d);
    if (s != DLREC_OK) return s;
    if (rmdir(path) != 0) return dlrec_error(DLREC_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return DLREC_OK;
  }
  if (unlink(path) != 0) return dlrec_error(DLREC_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
  return DLREC_OK;
}

dlrec_status dlrec_lock_dir(const char *dir, const char *what, int *fd_out) {
  *fd_out = -1;
  char path[4096];
  dlrec_status s = dlrec_path_join(path, sizeof path, dir, "lock");
  if (s != DLREC_OK) return s;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  int rc;
  while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    int err = errno;
    /* The holder writes its pid right after taking the lock; an empty file
     * means it is between the two. */
    char text[32] = "";
    ssize_t n = err == EWOULDBLOCK ? pread(fd, text, sizeof text - 1, 0) : -1;
    close(fd);
    if (err != EWOULDBLOCK) return dlrec_error(DLREC_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
    text[n > 0 ? n : 0] = '\0';
    text[strcspn(text, "\r\n")] = '\0';
    return dlrec_error(DLREC_ERR_INVALID, "%s is in use by %s (pid %s, holding %s); wait for it to finish or stop it",
                       dir, what, text[0] ? text : "unknown", path);
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  s = ftruncate(fd, 0) == 0 ? dlrec_pwrite_all(fd, pid, (size_t)len, 0, path)
                            : dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  if (s != DLREC_OK) {
    close(fd); /* releases the lock */
    return s;
  }
  *fd_out = fd;
  return DLREC_OK;
}

void dlrec_unlock_dir(int fd) {
  /* Closing the only descriptor of the open file releases the flock. The
   * file stays: removing it would race with a process that just opened it. */
  if (fd >= 0) close(fd);
}
