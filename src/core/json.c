/* JSON files through cJSON, with errors naming file, line, column and field. */
#include "core/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32c.h"
#include "core/fsutil.h"

#define JSON_MAX_BYTES (256u << 20)

dlrec_status dlrec_json_parse(const char *text, size_t n, const char *what, cJSON **out) {
  const char *end = NULL;
  *out = cJSON_ParseWithLengthOpts(text, n, &end, 0);
  if (*out) return DLREC_OK;
  /* cJSON reports where it stopped; turn that into line:column. */
  size_t pos = end && end >= text && end <= text + n ? (size_t)(end - text) : 0;
  int line = 1, col = 1;
  for (size_t i = 0; i < pos; i++) {
    if (text[i] == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  if (n == 0) return dlrec_error(DLREC_ERR_PARSE, "%s: empty, expected JSON", what);
  return dlrec_error(DLREC_ERR_PARSE, "%s:%d:%d: invalid JSON", what, line, col);
}

dlrec_status dlrec_json_read(const char *path, cJSON **out) {
  char *text;
  size_t n;
  *out = NULL;
  dlrec_status s = dlrec_read_file(path, JSON_MAX_BYTES, &text, &n);
  if (s != DLREC_OK) return s;
  s = dlrec_json_parse(text, n, path, out);
  free(text);
  return s;
}

dlrec_status dlrec_json_write(const char *path, const cJSON *json) {
  char *text = cJSON_Print(json);
  if (!text) return dlrec_error(DLREC_ERR_NOMEM, "%s: cannot format JSON", path);
  size_t n = strlen(text);
  text[n] = '\n'; /* replace the NUL: files end with a newline */
  dlrec_status s = dlrec_write_file_atomic(path, text, n + 1);
  free(text);
  return s;
}

static const cJSON *member(const cJSON *obj, const char *key) {
  return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

static dlrec_status missing(const char *what, const char *key) {
  return dlrec_error(DLREC_ERR_INVALID, "%s: missing field '%s'", what, key);
}

static dlrec_status wrong(const char *what, const char *key, const char *expected) {
  return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': expected %s", what, key, expected);
}

dlrec_status dlrec_json_get_u64_or(const cJSON *obj, const char *key, const char *what, uint64_t dflt,
                                   uint64_t *out) {
  const cJSON *v = member(obj, key);
  if (!v) {
    *out = dflt;
    return DLREC_OK;
  }
  /* cJSON keeps numbers as doubles: integers are exact up to 2^53. */
  double d = v->valuedouble;
  if (!cJSON_IsNumber(v) || d < 0 || d > 9007199254740992.0 || floor(d) != d)
    return wrong(what, key, "a non-negative integer");
  *out = (uint64_t)d;
  return DLREC_OK;
}

dlrec_status dlrec_json_get_u64(const cJSON *obj, const char *key, const char *what, uint64_t *out) {
  if (!member(obj, key)) return missing(what, key);
  return dlrec_json_get_u64_or(obj, key, what, 0, out);
}

dlrec_status dlrec_json_get_double_or(const cJSON *obj, const char *key, const char *what, double dflt,
                                      double *out) {
  const cJSON *v = member(obj, key);
  if (!v) {
    *out = dflt;
    return DLREC_OK;
  }
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return wrong(what, key, "a number");
  *out = v->valuedouble;
  return DLREC_OK;
}

dlrec_status dlrec_json_get_double(const cJSON *obj, const char *key, const char *what, double *out) {
  if (!member(obj, key)) return missing(what, key);
  return dlrec_json_get_double_or(obj, key, what, 0, out);
}

dlrec_status dlrec_json_get_bool_or(const cJSON *obj, const char *key, const char *what, int dflt, int *out) {
  const cJSON *v = member(obj, key);
  if (!v) {
    *out = dflt;
    return DLREC_OK;
  }
  if (!cJSON_IsBool(v)) return wrong(what, key, "true or false");
  *out = cJSON_IsTrue(v);
  return DLREC_OK;
}

dlrec_status dlrec_json_get_string_or(const cJSON *obj, const char *key, const char *what, const char *dflt,
                                      const char **out) {
  const cJSON *v = member(obj, key);
  if (!v) {
    *out = dflt;
    return DLREC_OK;
  }
  if (!cJSON_IsString(v)) return wrong(what, key, "a string");
  *out = v->valuestring;
  return DLREC_OK;
}

dlrec_status dlrec_json_get_string(const cJSON *obj, const char *key, const char *what, const char **out) {
  if (!member(obj, key)) return missing(what, key);
  return dlrec_json_get_string_or(obj, key, what, NULL, out);
}

dlrec_status dlrec_json_get_array(const cJSON *obj, const char *key, const char *what, const cJSON **out) {
  const cJSON *v = member(obj, key);
  if (!v) return missing(what, key);
  if (!cJSON_IsArray(v)) return wrong(what, key, "an array");
  *out = v;
  return DLREC_OK;
}

dlrec_status dlrec_json_get_object(const cJSON *obj, const char *key, const char *what, const cJSON **out) {
  const cJSON *v = member(obj, key);
  if (!v) return missing(what, key);
  if (!cJSON_IsObject(v)) return wrong(what, key, "an object");
  *out = v;
  return DLREC_OK;
}

dlrec_status dlrec_json_check_keys(const cJSON *obj, const char *what, const char *const *known) {
  if (!cJSON_IsObject(obj)) return dlrec_error(DLREC_ERR_INVALID, "%s: expected a JSON object", what);
  for (const cJSON *c = obj->child; c; c = c->next) {
    int ok = 0;
    for (const char *const *k = known; *k && !ok; k++) ok = c->string && !strcmp(c->string, *k);
    if (!ok) return dlrec_error(DLREC_ERR_INVALID, "%s: unknown field '%s'", what, c->string ? c->string : "?");
    /* cJSON keeps both members of a repeated key and lookups find the first,
     * so a later value would be ignored without a word. */
    for (const cJSON *d = obj->child; d != c; d = d->next)
      if (!strcmp(d->string, c->string)) return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s' given twice", what, c->string);
  }
  return DLREC_OK;
}

/* ---- sealed files ---- */

/* Finds the 8 digits of the one `key` member in text (the quoted key, ':'
 * and a quoted string of 8 lowercase hex digits); 0 and *at, or -1 when
 * there is none, or more than one (which one would count?). */
static int seal_digits(const char *text, size_t n, const char *key, size_t *at) {
  const size_t klen = strlen(key);
  int found = 0;
  for (size_t i = 0; i + klen + 2 <= n; i++) {
    if (text[i] != '"' || memcmp(text + i + 1, key, klen) != 0 || text[i + 1 + klen] != '"') continue;
    size_t j = i + klen + 2;
    while (j < n && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n')) j++;
    if (j >= n || text[j] != ':') continue; /* a string value that happens to read like the key */
    j++;
    while (j < n && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n')) j++;
    if (j + 10 > n || text[j] != '"' || text[j + 9] != '"') return -1;
    for (size_t k = j + 1; k < j + 9; k++)
      if (!((text[k] >= '0' && text[k] <= '9') || (text[k] >= 'a' && text[k] <= 'f'))) return -1;
    if (found++) return -1;
    *at = j + 1;
  }
  return found == 1 ? 0 : -1;
}

/* The CRC32C of text with the 8 digits at `at` read as zeros. */
static uint32_t seal_crc(const char *text, size_t n, size_t at) {
  static const char zeros[8] = {'0', '0', '0', '0', '0', '0', '0', '0'};
  uint32_t crc = dlrec_crc32c(0, text, at);
  crc = dlrec_crc32c(crc, zeros, 8);
  return dlrec_crc32c(crc, text + at + 8, n - at - 8);
}

dlrec_status dlrec_json_write_sealed(const char *path, cJSON *root, const char *key) {
  cJSON_DeleteItemFromObjectCaseSensitive(root, key);
  if (!cJSON_AddStringToObject(root, key, "00000000")) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  char *text = cJSON_Print(root);
  if (!text) return dlrec_error(DLREC_ERR_NOMEM, "%s: cannot format JSON", path);
  size_t n = strlen(text), at = 0;
  text[n++] = '\n'; /* replaces the NUL: files end with a newline */
  dlrec_status s;
  if (seal_digits(text, n, key, &at) != 0) {
    s = dlrec_error(DLREC_ERR_INVALID, "%s: cannot place the checksum '%s'", path, key);
  } else {
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", seal_crc(text, n, at));
    memcpy(text + at, hex, 8);
    cJSON_SetValuestring(cJSON_GetObjectItemCaseSensitive(root, key), hex);
    s = dlrec_write_file_atomic(path, text, n);
  }
  free(text);
  return s;
}

dlrec_status dlrec_json_check_sealed(const char *text, size_t n, const char *key, const char *path,
                                     const char *remedy) {
  size_t at = 0;
  if (seal_digits(text, n, key, &at) != 0)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: field '%s': expected one string of 8 lowercase hex digits (%s)", path,
                       key, remedy);
  char want[9];
  snprintf(want, sizeof want, "%08x", seal_crc(text, n, at));
  if (memcmp(want, text + at, 8) != 0)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: checksum mismatch: the file says %.8s, its bytes give %s (%s)", path,
                       text + at, want, remedy);
  return DLREC_OK;
}
