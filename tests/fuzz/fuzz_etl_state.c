/* Fuzz target for the ETL state's loader and the workflow parser, past
 * their checksums.
 *
 * An input starting with 'W' is a workflow (etl fit --workflow) for the
 * Criteo columns: parsed, and freed. Any other input is an ETL state:
 * etl.json's text, a NUL byte, then vocab.bin's bytes. The harness makes the
 * checksums right before loading, as a careful forger would (vocab.bin's two
 * CRCs and size, etl.json's record of them and its own seal), so that the
 * fuzzer reaches the semantic checks: column counts and id ranges, the
 * vocabularies' order and counts, the derived columns' operators and target
 * statistics. A state that loads encodes a line of empty fields and, for a
 * Criteo state, a line of values. Must never crash, hang, read out of bounds
 * or leak. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/etl_op.h"
#include "core/crc32c.h"
#include "core/fsutil.h"
#include "core/json.h"

static char dir[64];

static int write_all(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(p, 1, n, f) == n;
  return fclose(f) == 0 && ok ? 0 : -1;
}

static void encode(const dlrec_etl *e) {
  static float dense[DLREC_MAX_DENSE];
  uint64_t most = dlrec_etl_ids_max(e);
  uint32_t *ids = malloc((most ? most : 1) * sizeof *ids), nids[DLREC_MAX_SPARSE], cut;
  float label;
  if (!ids) return;
  (void)dlrec_etl_encode_line_multi(e, "", 0, 0, &label, dense, ids, nids, &cut);
  if (dlrec_etl_format(e) == DLREC_FORMAT_CRITEO) {
    static const char line[] = "3\t\t7\t100\t-2\t\t1\t0\t5\t9\t\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t"
                               "25c83c98\t\t6b7e9402\t0b153874\ta73ee510\t3b08e48b\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t";
    (void)dlrec_etl_encode_line_multi(e, line, sizeof line - 1, 0, &label, dense, ids, nids, &cut);
  }
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/dlrec-fuzz-etl-%ld", (long)getpid());
    if (dlrec_mkdirs(dir) != DLREC_OK) abort();
  }
  if (size && data[0] == 'W') {
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    static dlrec_columns cols;
    static etl_workflow wf;
    dlrec_columns_criteo(&cols, 1);
    if (etl_workflow_parse(text, &cols, data[size - 1] & 1, &wf) == DLREC_OK) etl_workflow_free(&wf);
    free(text);
    return 0;
  }
  const uint8_t *nul = memchr(data, 0, size);
  if (!nul) return 0;
  const size_t jn = (size_t)(nul - data), vn = size - jn - 1;
  unsigned char *v = malloc(vn + 1);
  if (!v) return 0;
  memcpy(v, nul + 1, vn);
  if (vn >= 32) {
    uint64_t n = vn;
    uint32_t body = dlrec_crc32c(0, v + 32, vn - 32), head;
    memcpy(v + 16, &n, 8);
    memcpy(v + 24, &body, 4);
    head = dlrec_crc32c(0, v, 28);
    memcpy(v + 28, &head, 4);
  }
  char path[128];
  snprintf(path, sizeof path, "%s/vocab.bin", dir);
  int ok = write_all(path, v, vn) == 0;
  uint32_t crc = vn >= 32 ? dlrec_crc32c(0, v + 32, vn - 32) : 0;
  free(v);
  cJSON *root = ok ? cJSON_ParseWithLength((const char *)data, jn) : NULL;
  snprintf(path, sizeof path, "%s/etl.json", dir);
  if (root && cJSON_IsObject(root)) {
    cJSON_DeleteItemFromObjectCaseSensitive(root, "vocab");
    cJSON *vo = cJSON_AddObjectToObject(root, "vocab");
    cJSON_AddStringToObject(vo, "file", "vocab.bin");
    cJSON_AddNumberToObject(vo, "bytes", (double)vn);
    cJSON_AddNumberToObject(vo, "crc32c", (double)crc);
    if (dlrec_json_write_sealed(path, root, "state_crc32c") == DLREC_OK) {
      dlrec_etl *e = NULL;
      if (dlrec_etl_load(&e, dir) == DLREC_OK) encode(e);
      dlrec_etl_free(e);
    }
  }
  cJSON_Delete(root);
  return 0;
}
