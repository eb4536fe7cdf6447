/* `dlrec inspect FILE.dlr`: print a .dlr file's schema, rows and row groups,
 * optionally its first rows, and verify every row group (checksum, id
 * ranges, offsets). Exit 0 when everything verifies, 1 otherwise, 2 on bad
 * usage. With --json the same facts go to stdout as one JSON object (errors
 * included, so stdout alone tells the story). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/dlr.h"
#include "core/progress.h"

typedef unsigned long long ull;

#define MAX_REPORTED_ERRORS 20
#define PROGRESS_MIN_BYTES (256ull << 20)

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec inspect FILE.dlr [--groups] [--head N] [--json] [-q] [-v]\n\n"
          "Prints the schema (label, dense columns, sparse columns with hotness and id\n"
          "ranges, table rows), the rows and row groups of a .dlr file, and verifies every\n"
          "row group: its CRC32C checksum, that every id lies in its column's range, and\n"
          "that the offsets of variable-hotness columns are sound.\n\n"
          "options:\n"
          "  --groups    one line per row group: offset, rows, bytes, checksum, first row\n"
          "  --head N    print the first N rows decoded (label, dense values, ids)\n"
          "  --json      print one JSON object on stdout instead of text\n"
          "  -q          no progress bar        -v  debug logs\n\n"
          "exit status: 0 everything verifies; 1 the file is unreadable or a row group fails\n"
          "(the error names the row group and its byte offset); 2 bad usage.\n");
}

static const char *hotness_text(const dlrec_sparse_col *c, char *buf, size_t n) {
  if (c->hotness == 1)
    snprintf(buf, n, "one-hot");
  else if (c->hotness)
    snprintf(buf, n, "%u-hot", c->hotness);
  else
    snprintf(buf, n, "variable, max %u", c->max_hotness);
  return buf;
}

/* A raw key (two ids: low, high) as 16 hex digits. */
static const char *key_hex(const uint32_t *w, char *buf, size_t n) {
  snprintf(buf, n, "%016llx", (ull)w[0] | (ull)w[1] << 32);
  return buf;
}

/* Row r of group view rg as text, or as a JSON object when j is not NULL.
 * The group's offsets passed dlrec_dlr_check_offsets, so indexing is safe. */
static void print_row(const dlrec_schema *s, const dlrec_rowgroup *rg, uint32_t r, uint64_t file_row, cJSON *jrows) {
  if (jrows) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "row", (double)file_row);
    if (s->has_label) cJSON_AddNumberToObject(o, "label", rg->labels[r]);
    cJSON *d = cJSON_AddArrayToObject(o, "dense");
    for (uint32_t k = 0; k < s->n_dense; k++)
      cJSON_AddItemToArray(d, cJSON_CreateNumber(rg->dense[(size_t)r * s->n_dense + k]));
    cJSON *sp = cJSON_AddObjectToObject(o, "sparse");
    for (uint32_t c = 0; c < s->n_sparse; c++) {
      uint32_t a = s->sparse[c].hotness ? r * s->sparse[c].hotness : rg->offsets[c][r];
      uint32_t z = s->sparse[c].hotness ? a + s->sparse[c].hotness : rg->offsets[c][r + 1];
      cJSON *ids = cJSON_AddArrayToObject(sp, s->sparse[c].name);
      char hex[24];
      for (uint32_t k = a; k < z; k += s->keys ? 2 : 1)
        cJSON_AddItemToArray(ids, s->keys ? cJSON_CreateString(key_hex(rg->ids[c] + k, hex, sizeof hex))
                                          : cJSON_CreateNumber(rg->ids[c][k]));
    }
    cJSON_AddItemToArray(jrows, o);
    return;
  }
  printf("  row %llu:", (ull)file_row);
  if (s->has_label) printf(" %s %g |", s->label_name, rg->labels[r]);
  for (uint32_t k = 0; k < s->n_dense; k++) printf(" %s %g", s->dense_names[k], rg->dense[(size_t)r * s->n_dense + k]);
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    const dlrec_sparse_col *col = &s->sparse[c];
    uint32_t a = col->hotness ? r * col->hotness : rg->offsets[c][r];
    uint32_t z = col->hotness ? a + col->hotness : rg->offsets[c][r + 1];
    printf(" %s %s", c == 0 ? "|" : "", col->name);
    if (s->keys) {
      char hex[24];
      printf(" [");
      for (uint32_t k = a; k < z; k += 2) printf("%s%s", k > a ? " " : "", key_hex(rg->ids[c] + k, hex, sizeof hex));
      printf("]");
    } else if (col->hotness == 1) {
      printf(" %u", rg->ids[c][a]);
    } else {
      printf(" [");
      for (uint32_t k = a; k < z; k++) printf("%s%u", k > a ? " " : "", rg->ids[c][k]);
      printf("]");
    }
  }
  printf("\n");
}

static void print_schema(const dlrec_dlr *f) {
  const dlrec_schema *s = dlrec_dlr_schema(f);
  uint32_t G = dlrec_dlr_row_groups(f), lo = 0, hi = 0;
  for (uint32_t i = 0; i < G; i++) {
    uint32_t r = dlrec_dlr_group_rows(f, i);
    if (i == 0 || r < lo) lo = r;
    if (r > hi) hi = r;
  }
  printf("file      %s (%llu bytes, format version %u)\n", dlrec_dlr_path(f), (ull)dlrec_dlr_file_bytes(f),
         dlrec_dlr_version(f));
  printf("rows      %llu in %u row groups", (ull)dlrec_dlr_rows(f), G);
  if (G) printf(" (rows per group: min %u, max %u)", lo, hi);
  printf("\n");
  printf("label     %s\n", s->has_label ? s->label_name : "(none: unlabeled rows)");
  printf("dense     %u:", s->n_dense);
  for (uint32_t i = 0; i < s->n_dense; i++) printf(" %s", s->dense_names[i]);
  printf("\n");
  if (s->keys) {
    printf("sparse    %u columns of raw 64-bit keys (for a hash table; two ids a key):\n", s->n_sparse);
    for (uint32_t i = 0; i < s->n_sparse; i++) {
      const dlrec_sparse_col *c = &s->sparse[i];
      if (c->hotness) printf("  %-16s %u key%s a row\n", c->name, c->hotness / 2, c->hotness == 2 ? "" : "s");
      else printf("  %-16s up to %u keys a row\n", c->name, c->max_hotness / 2);
    }
    return;
  }
  printf("sparse    %u columns, fused table of %llu rows:\n", s->n_sparse, (ull)s->table_rows);
  for (uint32_t i = 0; i < s->n_sparse; i++) {
    char h[48];
    const dlrec_sparse_col *c = &s->sparse[i];
    printf("  %-16s %-18s ids [%llu, %llu)\n", c->name, hotness_text(c, h, sizeof h), (ull)c->id_begin, (ull)c->id_end);
  }
}

static cJSON *json_schema(const dlrec_dlr *f) {
  const dlrec_schema *s = dlrec_dlr_schema(f);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "file", dlrec_dlr_path(f));
  cJSON_AddNumberToObject(o, "bytes", (double)dlrec_dlr_file_bytes(f));
  cJSON_AddNumberToObject(o, "version", dlrec_dlr_version(f));
  cJSON_AddNumberToObject(o, "rows", (double)dlrec_dlr_rows(f));
  cJSON_AddNumberToObject(o, "groups", dlrec_dlr_row_groups(f));
  if (s->has_label)
    cJSON_AddStringToObject(o, "label", s->label_name);
  else
    cJSON_AddNullToObject(o, "label");
  cJSON *d = cJSON_AddArrayToObject(o, "dense");
  for (uint32_t i = 0; i < s->n_dense; i++) cJSON_AddItemToArray(d, cJSON_CreateString(s->dense_names[i]));
  cJSON *sp = cJSON_AddArrayToObject(o, "sparse");
  for (uint32_t i = 0; i < s->n_sparse; i++) {
    const dlrec_sparse_col *c = &s->sparse[i];
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "name", c->name);
    cJSON_AddNumberToObject(x, "hotness", c->hotness);
    cJSON_AddNumberToObject(x, "max_hotness", c->max_hotness);
    cJSON_AddNumberToObject(x, "id_begin", (double)c->id_begin);
    cJSON_AddNumberToObject(x, "id_end", (double)c->id_end);
    cJSON_AddItemToArray(sp, x);
  }
  cJSON_AddNumberToObject(o, "table_rows", (double)s->table_rows);
  cJSON_AddBoolToObject(o, "keys", s->keys);
  cJSON *g = cJSON_AddArrayToObject(o, "row_groups");
  for (uint32_t i = 0; i < dlrec_dlr_row_groups(f); i++) {
    dlrec_dlr_group_info gi;
    dlrec_dlr_group_info_get(f, i, &gi);
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "offset", (double)gi.offset);
    cJSON_AddNumberToObject(x, "rows", gi.rows);
    cJSON_AddNumberToObject(x, "bytes", (double)gi.bytes);
    cJSON_AddNumberToObject(x, "crc", gi.crc);
    cJSON_AddNumberToObject(x, "first_row", (double)gi.first_row);
    cJSON_AddItemToArray(g, x);
  }
  return o;
}

/* The first `head` rows; a group whose offsets are unsound is reported, not read. */
static void print_head(const dlrec_dlr *f, uint64_t head, cJSON *jrows) {
  const dlrec_schema *s = dlrec_dlr_schema(f);
  if (!jrows) printf("head      first %llu rows:\n", (ull)(head < dlrec_dlr_rows(f) ? head : dlrec_dlr_rows(f)));
  uint64_t done = 0;
  for (uint32_t i = 0; i < dlrec_dlr_row_groups(f) && done < head; i++) {
    dlrec_rowgroup rg;
    if (dlrec_dlr_row_group(f, i, &rg) != DLREC_OK || dlrec_dlr_check_offsets(f, i) != DLREC_OK) {
      if (!jrows) printf("  (row group %u cannot be decoded: %s)\n", i, dlrec_last_error());
      return;
    }
    for (uint32_t r = 0; r < rg.rows && done < head; r++, done++)
      print_row(s, &rg, r, dlrec_dlr_group_first_row(f, i) + r, jrows);
  }
}

/* The file that did not open, as JSON: {"file", "ok": false, "errors"}. */
static int print_open_error(const char *path) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "file", path);
  cJSON_AddFalseToObject(o, "ok");
  cJSON *e = cJSON_AddArrayToObject(o, "errors");
  cJSON_AddItemToArray(e, cJSON_CreateString(dlrec_last_error()));
  char *text = cJSON_Print(o);
  printf("%s\n", text);
  free(text);
  cJSON_Delete(o);
  return 1;
}

static void print_groups(const dlrec_dlr *f) {
  printf("groups    %10s %12s %8s %12s %10s %12s\n", "group", "offset", "rows", "bytes", "crc32c", "first row");
  for (uint32_t i = 0; i < dlrec_dlr_row_groups(f); i++) {
    dlrec_dlr_group_info gi;
    dlrec_dlr_group_info_get(f, i, &gi);
    printf("          %10u %12llu %8u %12llu 0x%08x %12llu\n", i, (ull)gi.offset, gi.rows, (ull)gi.bytes, gi.crc,
           (ull)gi.first_row);
  }
}

/* Verifies every group, reporting each bad one (up to a limit, into jerr
 * when not NULL, else on stderr) rather than stopping at the first: a
 * damaged file is easier to judge whole. Returns the bad groups. */
static uint32_t verify_groups(dlrec_dlr *f, cJSON *jerr) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < dlrec_dlr_row_groups(f); i++) {
    dlrec_dlr_group_info gi;
    dlrec_dlr_group_info_get(f, i, &gi);
    total += gi.bytes;
  }
  /* A bar only where verifying takes long enough to wonder (~0.1 s and up). */
  dlrec_progress *bar = total >= PROGRESS_MIN_BYTES ? dlrec_progress_start("verify", total, "bytes") : NULL;
  uint32_t bad = 0;
  for (uint32_t i = 0; i < dlrec_dlr_row_groups(f); i++) {
    dlrec_dlr_group_info gi;
    dlrec_dlr_group_info_get(f, i, &gi);
    if (dlrec_dlr_verify(f, i) != DLREC_OK && ++bad <= MAX_REPORTED_ERRORS) {
      if (jerr) cJSON_AddItemToArray(jerr, cJSON_CreateString(dlrec_last_error()));
      else fprintf(stderr, "dlrec inspect: %s\n", dlrec_last_error());
    }
    dlrec_progress_add(bar, gi.bytes);
  }
  dlrec_progress_finish(bar);
  return bad;
}

int cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  int groups = 0, json = 0;
  uint64_t head = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (cli_common_option(a)) {
    } else if (!strcmp(a, "--groups")) {
      groups = 1;
    } else if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--head") || !strncmp(a, "--head=", 7)) {
      const char *v = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : NULL);
      if (!v) return cli_usage_error("inspect", "--head needs a number of rows");
      if (cli_parse_u64("--head", v, 0, 1000000000ull, &head) != DLREC_OK)
        return cli_usage_error("inspect", "%s", dlrec_last_error());
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("inspect", "unknown option '%s'", a);
    } else if (path) {
      return cli_usage_error("inspect", "one file at a time (got '%s' and '%s')", path, a);
    } else {
      path = a;
    }
  }
  if (!path) return cli_usage_error("inspect", "no file given");
  dlrec_dlr *f;
  if (dlrec_dlr_open(&f, path) != DLREC_OK) return json ? print_open_error(path) : cli_fail("inspect");
  cJSON *jo = json ? json_schema(f) : NULL;
  if (!json) print_schema(f);
  if (!json && groups) print_groups(f);
  if (head) print_head(f, head, json ? cJSON_AddArrayToObject(jo, "head") : NULL);
  const uint32_t bad = verify_groups(f, json ? cJSON_AddArrayToObject(jo, "errors") : NULL);
  uint32_t G = dlrec_dlr_row_groups(f);
  if (json) {
    cJSON_AddNumberToObject(jo, "bad_groups", bad);
    cJSON_AddBoolToObject(jo, "ok", bad == 0);
    char *text = cJSON_Print(jo);
    printf("%s\n", text);
    free(text);
    cJSON_Delete(jo);
  } else if (bad) {
    if (bad > MAX_REPORTED_ERRORS)
      fprintf(stderr, "dlrec inspect: (%u more bad row groups not shown)\n", bad - MAX_REPORTED_ERRORS);
    printf("verify    FAILED: %u of %u row groups are damaged\n", bad, G);
  } else {
    printf("verify    ok: %u row groups verified (checksums, id ranges, offsets)\n", G);
  }
  dlrec_dlr_close(f);
  return bad ? 1 : 0;
}
