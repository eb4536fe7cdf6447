/* File helpers: whole-file reads, fully-completed writes, atomic replacement,
 * and directories. Errors name the path and the system's reason. */
#ifndef DLREC_FSUTIL_H
#define DLREC_FSUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/status.h"

/* Reads a whole file into a malloc'd, NUL-terminated buffer (*n excludes the
 * NUL). Refuses files larger than max_bytes. */
dlrec_status dlrec_read_file(const char *path, size_t max_bytes, char **out, size_t *n);

/* write()/pwrite() until done, retrying on EINTR; `path` names the file in errors. */
dlrec_status dlrec_write_all(int fd, const void *buf, size_t n, const char *path);
dlrec_status dlrec_pwrite_all(int fd, const void *buf, size_t n, uint64_t offset, const char *path);
/* pread() until n bytes are read, retrying on EINTR; a file that ends first
 * is DLREC_ERR_CORRUPT ("truncated at offset ..."); `path` names the file. */
dlrec_status dlrec_pread_all(int fd, void *buf, size_t n, uint64_t offset, const char *path);
/* read() until n bytes or end of file; *got says how many. */
dlrec_status dlrec_read_full(int fd, void *buf, size_t n, size_t *got, const char *path);

/* Writes data to path atomically: path.tmp, fsync, rename, fsync of the directory. */
dlrec_status dlrec_write_file_atomic(const char *path, const void *data, size_t n);

/* Renames tmp to path and fsyncs the directory, so the new name survives a crash. */
dlrec_status dlrec_rename_durable(const char *tmp, const char *path);

/* fsyncs a directory (after creating or renaming entries in it). */
dlrec_status dlrec_fsync_dir(const char *dir);

/* Creates a directory (and missing parents); an existing one is fine. */
dlrec_status dlrec_mkdirs(const char *path);

/* Copies a regular file to dst (created or replaced), fsync'd. */
dlrec_status dlrec_copy_file(const char *src, const char *dst);

/* Removes a file or a directory tree; a missing path is fine. */
dlrec_status dlrec_remove_tree(const char *path);

/* Takes an exclusive lock on DIR/lock (flock, LOCK_EX | LOCK_NB), creating
 * the file, and writes this process's pid into it. Another holder makes it
 * fail at once with DLREC_ERR_INVALID naming the holder's pid as the file says
 * it; `what` names the holder's kind in that message ("a training run").
 * *fd is the lock's descriptor (close-on-exec): dlrec_unlock_dir releases it,
 * and so does the process's death, so a crash never leaves a stale lock. */
dlrec_status dlrec_lock_dir(const char *dir, const char *what, int *fd);
void dlrec_unlock_dir(int fd); /* accepts -1 */

/* Joins dir and name into out (size out_size); an error if it does not fit. */
dlrec_status dlrec_path_join(char *out, size_t out_size, const char *dir, const char *name);

#endif
