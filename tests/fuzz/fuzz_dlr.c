/* Fuzzing the .dlr reader: the input bytes are a .dlr file. Opening, verifying
 * every row group, decoding every row, and (when the file opens) a loader
 * epoch over it must never crash, hang or read outside the bytes; errors are
 * fine. Seeds in tests/fuzz/corpus/fuzz_dlr are small valid files (one-hot,
 * multi-hot and variable-hotness columns, no label, zero rows).
 *
 * A mutated file almost never keeps valid checksums, which would stop every
 * input at the header CRC. So each input is tried twice: as it is, and with
 * its header, row-group and index checksums recomputed wherever the (fuzzed)
 * fields locate them inside the bytes (when that changes any byte), which
 * lets the fuzzer reach the structural checks behind the checksums. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data/dlr_format.h"
#include "core/crc32c.h"
#include "data/dlr.h"
#include "data/loader.h"

/* Reads every id of group i through its offsets (or hotness), as a consumer
 * would; only after dlrec_dlr_check_offsets said that is safe. */
static uint64_t walk_group(const dlrec_dlr *f, uint32_t i) {
  dlrec_rowgroup rg;
  if (dlrec_dlr_row_group(f, i, &rg) != DLREC_OK || dlrec_dlr_check_offsets(f, i) != DLREC_OK) return 0;
  const dlrec_schema *s = dlrec_dlr_schema(f);
  uint64_t sum = 0;
  for (uint32_t r = 0; r < rg.rows; r++) {
    if (rg.labels) sum += (uint64_t)(rg.labels[r] != 0);
    for (uint32_t d = 0; d < s->n_dense; d++) sum += (uint64_t)(rg.dense[(size_t)r * s->n_dense + d] > 0);
    for (uint32_t c = 0; c < s->n_sparse; c++) {
      uint32_t h = s->sparse[c].hotness;
      uint64_t a = h ? (uint64_t)r * h : rg.offsets[c][r], z = h ? a + h : rg.offsets[c][r + 1];
      for (uint64_t k = a; k < z; k++) sum += rg.ids[c][k];
    }
  }
  return sum;
}

/* A loader epoch over the file, without checksum verification for half of
 * the inputs, so that damaged-but-structurally-sound groups are copied. The
 * loader opens paths, so the bytes go to a memory file named through
 * /proc/self/fd (a file on disk costs a create, a write and an unlink per
 * input, a third of the target's time). */
static void run_loader(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz_dlr", MFD_CLOEXEC);
  if (fd < 0) return;
  size_t w = 0;
  while (w < size) {
    ssize_t k = write(fd, data + w, size - w);
    if (k <= 0) break;
    w += (size_t)k;
  }
  if (w == size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    dlrec_loader_opts o;
    dlrec_loader_opts_default(&o);
    o.batch_rows = 7;
    o.window_groups = 2;
    o.slice_rows = 3;
    o.threads = 2;
    o.prefetch = 2;
    o.verify = (size & 1) != 0; /* both paths */
    dlrec_loader *l;
    if (dlrec_loader_open(&l, (const char *const *)&(const char *){path}, 1, &o) == DLREC_OK) {
      const dlrec_batch *b;
      for (int n = 0; n < 100000 && dlrec_loader_next(l, &b) == DLREC_OK; n++) {
      }
      dlrec_loader_close(l);
    }
  }
  close(fd);
}

/* Recomputes the checksums that the header and index fields point at, when
 * they lie inside the buffer (group CRCs first: the index CRC covers them). */
static void repair_checksums(uint8_t *b, size_t size) {
  if (size < DLR_HDR_FIXED) return;
  uint64_t hb = dlr_get32(b + DLR_HDR_BYTES);
  uint64_t io = dlr_get64(b + DLR_HDR_INDEX_OFFSET), groups = dlr_get64(b + DLR_HDR_GROUPS);
  if (groups < (1u << 20) && io <= size && dlr_index_bytes(groups) <= size - io) {
    uint8_t *ix = b + io;
    for (uint64_t i = 0; i < groups; i++) {
      uint8_t *e = ix + DLR_INDEX_FIXED + DLR_INDEX_ENTRY * i;
      uint64_t off = dlr_get64(e), bytes = dlr_get64(e + 8);
      if (off <= size && bytes <= size - off) dlr_put32(e + 20, dlrec_crc32c(0, b + off, bytes));
    }
    uint64_t ib = dlr_index_bytes(groups);
    dlr_put32(ix + ib - 4, dlrec_crc32c(0, ix, ib - 4));
  }
  if (hb >= 4 && hb <= size) dlr_put32(b + hb - 4, dlrec_crc32c(0, b, hb - 4));
}

/* Opens, verifies and walks buf, and runs a loader over it when it opens. */
static void one_input(const uint8_t *buf, size_t size) {
  dlrec_dlr *f;
  if (dlrec_dlr_open_buffer(&f, buf, size, "fuzz.dlr") == DLREC_OK) {
    volatile uint64_t sink = 0;
    for (uint32_t i = 0; i < dlrec_dlr_row_groups(f); i++) {
      (void)dlrec_dlr_verify(f, i);
      sink += walk_group(f, i);
      dlrec_dlr_group_info gi;
      dlrec_dlr_group_info_get(f, i, &gi);
      sink += gi.crc;
    }
    (void)sink;
    dlrec_dlr_close(f);
    if (size <= (1u << 20)) run_loader(buf, size);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The reader uses columns in place, so it wants the alignment a mapping
   * has; the fuzzer's buffer has none. */
  uint8_t *buf = aligned_alloc(64, (size + 64) & ~(size_t)63);
  if (!buf) return 0;
  memcpy(buf, data, size);
  one_input(buf, size);
  /* Repaired, when that changes anything: an input whose checksums were
   * already right would only run the same work twice. */
  repair_checksums(buf, size);
  if (memcmp(buf, data, size) != 0) one_input(buf, size);
  free(buf);
  return 0;
}
