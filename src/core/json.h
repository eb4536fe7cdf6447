/* JSON files (configs, ETL state, checkpoints) on top of cJSON, with errors
 * that name the file, the line and the field.
 */
#ifndef DLREC_JSON_H
#define DLREC_JSON_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "core/status.h"

/* Reads and parses a JSON file. A syntax error names "path:line:column". The
 * caller frees *out with cJSON_Delete. */
dlrec_status dlrec_json_read(const char *path, cJSON **out);

/* Parses JSON text of n bytes; `what` names it in errors. */
dlrec_status dlrec_json_parse(const char *text, size_t n, const char *what, cJSON **out);

/* Writes JSON (pretty-printed) to path atomically (temp file, fsync, rename). */
dlrec_status dlrec_json_write(const char *path, const cJSON *json);

/* Sealed JSON files carry a CRC32C of their own bytes in a string member
 * `key` of the top object: 8 lowercase hex digits, computed over the file's
 * text with those 8 digits read as "00000000". A flipped bit anywhere (a
 * value, a name, whitespace, the checksum itself) is then refused wherever
 * the file is read, before any field of it is believed.
 *
 * dlrec_json_write_sealed sets root's `key` and writes root atomically, as
 * dlrec_json_write does. */
dlrec_status dlrec_json_write_sealed(const char *path, cJSON *root, const char *key);
/* Checks the seal of a sealed file's text (n bytes, as read): exactly one
 * `key` member holding 8 hex digits that match the text. Errors name path,
 * and a mismatch ends with `remedy` (what the user should do). */
dlrec_status dlrec_json_check_sealed(const char *text, size_t n, const char *key, const char *path,
                                     const char *remedy);

/* Typed field readers. `what` names the object in errors ("etl.json"), and
 * errors read "etl.json: field 'columns[3].name': expected a string".
 * With a default (the _or variants) a missing key yields the default; a key of
 * the wrong type or out of range is always an error. */
dlrec_status dlrec_json_get_u64(const cJSON *obj, const char *key, const char *what, uint64_t *out);
dlrec_status dlrec_json_get_u64_or(const cJSON *obj, const char *key, const char *what, uint64_t dflt, uint64_t *out);
dlrec_status dlrec_json_get_double(const cJSON *obj, const char *key, const char *what, double *out);
dlrec_status dlrec_json_get_double_or(const cJSON *obj, const char *key, const char *what, double dflt, double *out);
dlrec_status dlrec_json_get_bool_or(const cJSON *obj, const char *key, const char *what, int dflt, int *out);
/* The returned string lives as long as obj. */
dlrec_status dlrec_json_get_string(const cJSON *obj, const char *key, const char *what, const char **out);
dlrec_status dlrec_json_get_string_or(const cJSON *obj, const char *key, const char *what, const char *dflt, const char **out);
/* An array (or object when want_object) member that must be present. */
dlrec_status dlrec_json_get_array(const cJSON *obj, const char *key, const char *what, const cJSON **out);
dlrec_status dlrec_json_get_object(const cJSON *obj, const char *key, const char *what, const cJSON **out);

/* Refuses keys not in `known` (a NULL-terminated list), so that a typo in a
 * config is an error rather than a silently ignored setting, and keys given
 * twice, whose second value would otherwise be ignored. */
dlrec_status dlrec_json_check_keys(const cJSON *obj, const char *what, const char *const *known);

#endif
