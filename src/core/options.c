/* Option tables (options.h): reading values into struct fields from JSON
 * and from text, writing them back, and printing a table's reference. */
#include "core/options.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/strbuf.h"

/* The field of o in obj (k 0) or obj2 (k 1); NULL when o has none there. */
static void *field(const dlrec_option *o, void *obj, void *obj2, int k) {
  const size_t off = k ? o->offset2 : o->offset;
  void *base = k ? obj2 : obj;
  return off == DLREC_OPT_NO_FIELD || !base ? NULL : (char *)base + off;
}

static const void *cfield(const dlrec_option *o, const void *obj) {
  return o->offset == DLREC_OPT_NO_FIELD ? NULL : (const char *)obj + o->offset;
}

static void put_uint(void *f, size_t size, uint64_t v) {
  if (size == 8) {
    memcpy(f, &v, 8);
  } else if (size == 4) {
    uint32_t u = (uint32_t)v;
    memcpy(f, &u, 4);
  } else {
    uint8_t u = (uint8_t)v;
    memcpy(f, &u, 1);
  }
}

static uint64_t get_uint(const void *f, size_t size) {
  if (size == 8) {
    uint64_t v;
    memcpy(&v, f, 8);
    return v;
  }
  if (size == 4) {
    uint32_t v;
    memcpy(&v, f, 4);
    return v;
  }
  return *(const uint8_t *)f;
}

/* The largest value a UINT field holds. */
static uint64_t uint_max(size_t size) { return size == 8 ? UINT64_MAX : size == 4 ? UINT32_MAX : UINT8_MAX; }

/* Stores one typed value into each field of o (text: STRING, TEXT, JSON). */
typedef struct value {
  uint64_t u;
  double d;
  int i;
  const char *text;
} value;

static dlrec_status store(const dlrec_option *o, const value *v, const char *what, int from_json, void *obj,
                          void *obj2) {
  if (o->type == DLREC_OPT_STRING && strlen(v->text) >= o->size)
    return from_json ? dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': longer than %zu bytes", what, o->key, o->size - 1)
                     : dlrec_error(DLREC_ERR_INVALID, "%s: longer than %zu bytes", what, o->size - 1);
  for (int k = 0; k < 2; k++) {
    void *f = field(o, obj, obj2, k);
    if (!f) continue;
    switch (o->type) {
    case DLREC_OPT_BOOL: {
      const int b = k == 0 && o->negate ? !v->i : v->i;
      memcpy(f, &b, sizeof b);
      break;
    }
    case DLREC_OPT_UINT: put_uint(f, o->size, v->u); break;
    case DLREC_OPT_FLOAT: {
      const float x = (float)v->d;
      memcpy(f, &x, sizeof x);
      break;
    }
    case DLREC_OPT_DOUBLE: memcpy(f, &v->d, sizeof v->d); break;
    case DLREC_OPT_CHOICE: memcpy(f, &v->i, sizeof v->i); break;
    case DLREC_OPT_STRING: memmove(f, v->text, strlen(v->text) + 1); break;
    default: memcpy(f, &v->text, sizeof v->text); break; /* TEXT, JSON */
    }
  }
  return DLREC_OK;
}

/* The choices' names ("a, b, c" or, with last " or ", "a, b or c"). */
static void choice_list(const dlrec_opt_choice *c, const char *last, char *out, size_t size) {
  int n = 0, total = 0;
  for (const dlrec_opt_choice *p = c; p->name; p++) total += !p->alias;
  size_t at = 0;
  out[0] = '\0';
  for (const dlrec_opt_choice *p = c; p->name && at < size; p++) {
    if (p->alias) continue;
    const char *sep = n == 0 ? "" : n == total - 1 ? last : ", ";
    at += (size_t)snprintf(out + at, size - at, "%s%s", sep, p->name);
    n++;
  }
}

static const dlrec_opt_choice *choice_find(const dlrec_opt_choice *c, const char *name) {
  for (; c->name; c++)
    if (!strcmp(c->name, name)) return c;
  return NULL;
}

static dlrec_status wrong(const char *what, const char *key, const char *expected) {
  return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': expected %s", what, key, expected);
}

dlrec_status dlrec_option_from_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj, void *obj2) {
  value x = {0};
  switch (o->type) {
  case DLREC_OPT_BOOL:
    if (!cJSON_IsBool(v)) return wrong(what, o->key, "true or false");
    x.i = cJSON_IsTrue(v);
    break;
  case DLREC_OPT_UINT: {
    /* cJSON keeps numbers as doubles: integers are exact up to 2^53. */
    const double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d < 0 || d > 9007199254740992.0 || floor(d) != d)
      return wrong(what, o->key, "a non-negative integer");
    x.u = (uint64_t)d;
    if (x.u < o->min || x.u > o->max)
      return o->max == uint_max(o->size)
                 ? dlrec_error(DLREC_ERR_INVALID, "%s: field '%s' must be >= %llu", what, o->key,
                               (unsigned long long)o->min)
                 : dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %llu is out of range [%llu, %llu]", what, o->key,
                               (unsigned long long)x.u, (unsigned long long)o->min, (unsigned long long)o->max);
    break;
  }
  case DLREC_OPT_FLOAT:
  case DLREC_OPT_DOUBLE:
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return wrong(what, o->key, "a number");
    x.d = v->valuedouble;
    if (!(x.d >= o->lo && x.d <= o->hi))
      return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %g is out of range [%g, %g]", what, o->key, x.d, o->lo,
                         o->hi);
    break;
  case DLREC_OPT_CHOICE: {
    if (!cJSON_IsString(v)) return wrong(what, o->key, "a string");
    const dlrec_opt_choice *c = choice_find(o->choices, v->valuestring);
    if (!c) {
      char list[256];
      choice_list(o->choices, ", ", list, sizeof list);
      return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': '%s' is not one of %s", what, o->key, v->valuestring, list);
    }
    x.i = c->value;
    break;
  }
  case DLREC_OPT_STRING:
  case DLREC_OPT_TEXT:
    if (!cJSON_IsString(v)) return wrong(what, o->key, "a string");
    x.text = v->valuestring;
    break;
  case DLREC_OPT_JSON: {
    if (!cJSON_IsObject(v)) return wrong(what, o->key, "an object");
    /* The object's text, kept as its own valuestring (unused by objects),
     * so that it lives, and is freed, with the JSON it came from. */
    cJSON *m = (cJSON *)v;
    if (!m->valuestring && !(m->valuestring = cJSON_PrintUnformatted(m)))
      return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    x.text = m->valuestring;
    break;
  }
  case DLREC_OPT_CUSTOM: return o->custom->from_json(o, v, what, obj);
  }
  return store(o, &x, what, 1, obj, obj2);
}

dlrec_status dlrec_opt_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
    return dlrec_error(DLREC_ERR_INVALID, "%s: expected an integer, got '%s'", what, s ? s : "");
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t mult = 1;
  if (*end == 'k' || *end == 'K') mult = 1000ull, end++;
  else if (*end == 'M') mult = 1000000ull, end++;
  else if (*end == 'G') mult = 1000000000ull, end++;
  if (errno || end == s || *end || (mult > 1 && v > UINT64_MAX / mult))
    return dlrec_error(DLREC_ERR_INVALID, "%s: expected an integer, got '%s'", what, s);
  v *= mult;
  if (v < min || v > max)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %llu is out of range [%llu, %llu]", what, v, (unsigned long long)min,
                       (unsigned long long)max);
  *out = v;
  return DLREC_OK;
}

dlrec_status dlrec_opt_parse_double(const char *what, const char *s, double lo, double hi, double *out) {
  if (!s || !*s) return dlrec_error(DLREC_ERR_INVALID, "%s: expected a number, got ''", what);
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v))
    return dlrec_error(DLREC_ERR_INVALID, "%s: expected a number, got '%s'", what, s);
  if (v < lo || v > hi) return dlrec_error(DLREC_ERR_INVALID, "%s: %g is out of range [%g, %g]", what, v, lo, hi);
  *out = v;
  return DLREC_OK;
}

dlrec_status dlrec_option_from_text(const dlrec_option *o, const char *text, const char *what, void *obj,
                                    void *obj2) {
  value x = {.text = text};
  dlrec_status st = DLREC_OK;
  switch (o->type) {
  case DLREC_OPT_BOOL:
    if (strcmp(text, "true") && strcmp(text, "false"))
      return dlrec_error(DLREC_ERR_INVALID, "%s: expected true or false, got '%s'", what, text);
    x.i = !strcmp(text, "true");
    break;
  case DLREC_OPT_UINT: st = dlrec_opt_parse_u64(what, text, o->min, o->max, &x.u); break;
  case DLREC_OPT_FLOAT:
  case DLREC_OPT_DOUBLE: st = dlrec_opt_parse_double(what, text, o->lo, o->hi, &x.d); break;
  case DLREC_OPT_CHOICE: {
    const dlrec_opt_choice *c = choice_find(o->choices, text);
    if (!c) {
      char list[256];
      choice_list(o->choices, " or ", list, sizeof list);
      return dlrec_error(DLREC_ERR_INVALID, "%s: expected %s, got '%s'", what, list, text);
    }
    x.i = c->value;
    break;
  }
  case DLREC_OPT_CUSTOM: return o->custom->from_text(o, text, what, obj);
  default: break; /* STRING, TEXT, JSON */
  }
  return st == DLREC_OK ? store(o, &x, what, 0, obj, obj2) : st;
}

cJSON *dlrec_option_to_json(const dlrec_option *o, const void *obj) {
  const void *f = cfield(o, obj);
  switch (o->type) {
  case DLREC_OPT_BOOL: {
    int b;
    memcpy(&b, f, sizeof b);
    return cJSON_CreateBool(o->negate ? !b : b);
  }
  case DLREC_OPT_UINT: return cJSON_CreateNumber((double)get_uint(f, o->size));
  case DLREC_OPT_FLOAT: {
    float x;
    memcpy(&x, f, sizeof x);
    return cJSON_CreateNumber(x);
  }
  case DLREC_OPT_DOUBLE: {
    double x;
    memcpy(&x, f, sizeof x);
    return cJSON_CreateNumber(x);
  }
  case DLREC_OPT_CHOICE: {
    int v;
    memcpy(&v, f, sizeof v);
    for (const dlrec_opt_choice *c = o->choices; c->name; c++)
      if (!c->alias && c->value == v) return cJSON_CreateString(c->name);
    return cJSON_CreateNull();
  }
  case DLREC_OPT_STRING: return cJSON_CreateString((const char *)f);
  case DLREC_OPT_CUSTOM: return o->custom->to_json(o, obj);
  default: { /* TEXT, JSON */
    const char *t;
    memcpy(&t, f, sizeof t);
    return t ? cJSON_CreateString(t) : cJSON_CreateNull();
  }
  }
}

void dlrec_options_defaults(const dlrec_option *table, unsigned where, void *obj, void *obj2) {
  for (const dlrec_option *o = table; o->key; o++)
    if (o->dflt && (!where || (o->where & where))) {
      dlrec_status st = dlrec_option_from_text(o, o->dflt, o->key, obj, obj2);
      (void)st; /* every default reads: test_train_config checks them */
    }
}

/* ---- configs: sections of options ---- */

/* The sections of a table, each once, in the order they first appear. */
static int sections(const dlrec_option *table, const char **out, int cap) {
  int n = 0;
  for (const dlrec_option *o = table; o->key; o++) {
    int seen = 0;
    for (int i = 0; i < n; i++) seen |= !strcmp(out[i], o->section);
    if (!seen && n < cap) out[n++] = o->section;
  }
  return n;
}

/* The keys a section's object may hold: its options', and the names of the
 * sections inside it (the next component of every section under it, kept
 * in names). */
static void section_keys(const dlrec_option *table, const char *section, const char **keys, int cap,
                         char (*names)[64]) {
  const char *secs[64];
  const int ns = sections(table, secs, 64);
  const size_t len = strlen(section);
  int n = 0, nn = 0;
  for (const dlrec_option *o = table; o->key && n < cap - 1; o++)
    if (!strcmp(o->section, section)) keys[n++] = o->key;
  for (int i = 0; i < ns && n < cap - 1 && nn < 64; i++) {
    const char *s = secs[i];
    if (!s[0] || (len && (strncmp(s, section, len) || s[len] != '.'))) continue;
    const char *sub = s + (len ? len + 1 : 0), *dot = strchr(sub, '.');
    snprintf(names[nn], 64, "%.*s", (int)(dot ? (size_t)(dot - sub) : strlen(sub)), sub);
    int seen = 0;
    for (int k = 0; k < n; k++) seen |= !strcmp(keys[k], names[nn]);
    if (!seen) keys[n++] = names[nn++];
  }
  keys[n] = NULL;
}

/* root's object at a section's path, or NULL. */
static const cJSON *section_of(const cJSON *root, const char *section) {
  char path[128];
  snprintf(path, sizeof path, "%s", section);
  const cJSON *node = root;
  for (char *p = path, *dot; node && *p; p = dot ? dot + 1 : p + strlen(p)) {
    dot = strchr(p, '.');
    if (dot) *dot = '\0';
    node = cJSON_GetObjectItemCaseSensitive(node, p);
  }
  return node;
}

dlrec_status dlrec_options_read(const dlrec_option *table, const cJSON *root, const char *what, void *obj) {
  const char *secs[64], *keys[128];
  const int ns = sections(table, secs, 64);
  dlrec_status st = DLREC_OK;
  for (int i = 0; i < ns && st == DLREC_OK; i++) {
    const cJSON *node = section_of(root, secs[i]);
    if (!node) continue;
    char where[320];
    snprintf(where, sizeof where, "%.200s%s%.100s", what, secs[i][0] ? ": " : "", secs[i]);
    char names[64][64];
    section_keys(table, secs[i], keys, 128, names);
    st = dlrec_json_check_keys(node, where, keys);
    for (const dlrec_option *o = table; o->key && st == DLREC_OK; o++) {
      const cJSON *v = strcmp(o->section, secs[i]) ? NULL : cJSON_GetObjectItemCaseSensitive(node, o->key);
      if (v) st = dlrec_option_from_json(o, v, where, obj, NULL);
    }
  }
  return st;
}

cJSON *dlrec_options_write(const dlrec_option *table, const void *obj) {
  cJSON *root = cJSON_CreateObject();
  for (const dlrec_option *o = table; o->key && root; o++) {
    /* The section's object, made on the way in the table's order. */
    char path[128];
    snprintf(path, sizeof path, "%s", o->section);
    cJSON *node = root;
    for (char *p = path, *dot; *p; p = dot ? dot + 1 : p + strlen(p)) {
      dot = strchr(p, '.');
      if (dot) *dot = '\0';
      cJSON *next = cJSON_GetObjectItemCaseSensitive(node, p);
      node = next ? next : cJSON_AddObjectToObject(node, p);
    }
    cJSON *v = dlrec_option_to_json(o, obj);
    if (v && o->omit_default && o->dflt && cJSON_IsString(v) && !strcmp(v->valuestring, o->dflt)) {
      cJSON_Delete(v);
      v = NULL;
    }
    if (v) cJSON_AddItemToObject(node, o->key, v);
  }
  return root;
}

dlrec_status dlrec_options_read_flat(const dlrec_option *table, unsigned where, const cJSON *root, const char *what,
                                     const char *const *extra, void *obj, void *obj2) {
  const char *keys[128];
  int n = 0;
  for (const dlrec_option *o = table; o->key && n < 120; o++) {
    int seen = 0;
    for (int i = 0; i < n; i++) seen |= !strcmp(keys[i], o->key);
    if (!seen && (o->where & where)) keys[n++] = o->key;
  }
  for (const char *const *k = extra; k && *k && n < 127; k++) keys[n++] = *k;
  keys[n] = NULL;
  dlrec_status st = dlrec_json_check_keys(root, what, keys);
  for (const dlrec_option *o = table; o->key && st == DLREC_OK; o++) {
    const cJSON *v = o->where & where ? cJSON_GetObjectItemCaseSensitive(root, o->key) : NULL;
    if (!v) continue;
    /* A choice is named as a flag's ("WHAT: KEY: expected a or b, got
     * 'c'"), as the host API always named them. */
    char name[320];
    snprintf(name, sizeof name, "%.200s: %.100s", what, o->key);
    st = o->type == DLREC_OPT_CHOICE && cJSON_IsString(v) ? dlrec_option_from_text(o, v->valuestring, name, obj, obj2)
                                                           : dlrec_option_from_json(o, v, what, obj, obj2);
  }
  return st;
}

const dlrec_option *dlrec_options_find_flag(const dlrec_option *table, unsigned where, const char *flag) {
  for (const dlrec_option *o = table; o->key; o++)
    if (o->flag && (o->where & where) && !strcmp(o->flag, flag)) return o;
  return NULL;
}

/* ---- the reference ---- */

/* An integer as the docs write it: 2^20, 2^32 - 3, or in decimal. */
static void put_int(dlrec_strbuf *b, uint64_t v) {
  for (int k = 10; k < 64; k++)
    for (uint64_t d = 0; d < 4; d++)
      if (v + d == (uint64_t)1 << k) {
        if (d) dlrec_strbuf_printf(b, "2^%d - %llu", k, (unsigned long long)d);
        else dlrec_strbuf_printf(b, "2^%d", k);
        return;
      }
  if (v == UINT64_MAX) dlrec_strbuf_printf(b, "2^64 - 1");
  else dlrec_strbuf_printf(b, "%llu", (unsigned long long)v);
}

/* A number as the docs write it: 1000, 0.9999999, 1e6, 1e-9. */
static void put_num(dlrec_strbuf *b, double x) {
  char t[64];
  for (int k = 5; k < 16; k++)
    if (x == pow(10, k)) {
      dlrec_strbuf_printf(b, "1e%d", k);
      return;
    }
  if (x == floor(x) && fabs(x) < 1e15) {
    dlrec_strbuf_printf(b, "%.0f", x);
    return;
  }
  snprintf(t, sizeof t, "%.10g", x);
  char *e = strchr(t, 'e');
  if (e) { /* 1e+06 -> 1e6, 1e-09 -> 1e-9 */
    char *p = e + 1, *q = e + 1;
    if (*p == '+') p++;
    if (*p == '-') *q++ = *p++;
    while (*p == '0' && p[1]) p++;
    memmove(q, p, strlen(p) + 1);
  }
  dlrec_strbuf_printf(b, "%s", t);
}

/* Text in a table's cell: '|' escaped. */
static void put_cell(dlrec_strbuf *b, const char *text) {
  for (const char *p = text; *p; p++) {
    if (*p == '|') dlrec_strbuf_printf(b, "\\|");
    else dlrec_strbuf_printf(b, "%c", *p);
  }
}

static void put_type(dlrec_strbuf *b, const dlrec_option *o) {
  switch (o->type) {
  case DLREC_OPT_BOOL: dlrec_strbuf_printf(b, "bool"); break;
  case DLREC_OPT_UINT:
    dlrec_strbuf_printf(b, "integer");
    if (o->max == uint_max(o->size) && o->min) dlrec_strbuf_printf(b, " ≥ %llu", (unsigned long long)o->min);
    if (o->max != uint_max(o->size)) {
      dlrec_strbuf_printf(b, " in [");
      put_int(b, o->min);
      dlrec_strbuf_printf(b, ", ");
      put_int(b, o->max);
      dlrec_strbuf_printf(b, "]");
    }
    break;
  case DLREC_OPT_FLOAT:
  case DLREC_OPT_DOUBLE:
    dlrec_strbuf_printf(b, "number in [");
    put_num(b, o->lo);
    dlrec_strbuf_printf(b, ", ");
    put_num(b, o->hi);
    dlrec_strbuf_printf(b, "]");
    break;
  case DLREC_OPT_CHOICE: {
    int total = 0, n = 0;
    for (const dlrec_opt_choice *c = o->choices; c->name; c++) total += !c->alias;
    for (const dlrec_opt_choice *c = o->choices; c->name; c++)
      if (!c->alias) dlrec_strbuf_printf(b, "%s`\"%s\"`", n++ == 0 ? "" : n == total ? " or " : ", ", c->name);
    break;
  }
  case DLREC_OPT_JSON: dlrec_strbuf_printf(b, "object"); break;
  case DLREC_OPT_CUSTOM: dlrec_strbuf_printf(b, "%s", o->custom->type_doc); break;
  default: dlrec_strbuf_printf(b, "string"); break; /* STRING, TEXT */
  }
}

static void put_default(dlrec_strbuf *b, const dlrec_option *o) {
  char *end = NULL;
  if (o->dflt) strtod(o->dflt, &end);
  const int text = o->type == DLREC_OPT_CHOICE || o->type == DLREC_OPT_STRING || o->type == DLREC_OPT_TEXT ||
                   (o->type == DLREC_OPT_CUSTOM && o->dflt && (end == o->dflt || *end));
  if (o->dflt_doc) put_cell(b, o->dflt_doc);
  else if (!o->dflt) dlrec_strbuf_printf(b, "none");
  else if (text) dlrec_strbuf_printf(b, "`\"%s\"`", o->dflt);
  else dlrec_strbuf_printf(b, "`%s`", o->dflt);
}

char *dlrec_options_markdown(const dlrec_option *table, const dlrec_opt_reference *r) {
  dlrec_strbuf b = {0};
  if (r->flags)
    dlrec_strbuf_printf(&b, "| flag | API key | command | type | default | meaning |\n"
                            "| --- | --- | --- | --- | --- | --- |\n");
  else dlrec_strbuf_printf(&b, "| key | type | default | meaning |\n| --- | --- | --- | --- |\n");
  for (const dlrec_option *o = table; o->key; o++) {
    if (r->flags) {
      if (o->flag) dlrec_strbuf_printf(&b, "| `%s` ", o->flag);
      else dlrec_strbuf_printf(&b, "| ");
      dlrec_strbuf_printf(&b, "| `%s` | ", o->key);
      for (unsigned bit = 0, n = 0; r->commands && r->commands[bit]; bit++)
        if (o->where & (1u << bit)) dlrec_strbuf_printf(&b, "%s%s", n++ ? ", " : "", r->commands[bit]);
      dlrec_strbuf_printf(&b, " | ");
    } else {
      dlrec_strbuf_printf(&b, "| `%s%s%s` | ", o->section, o->section[0] ? "." : "", o->key);
    }
    put_type(&b, o);
    dlrec_strbuf_printf(&b, " | ");
    put_default(&b, o);
    dlrec_strbuf_printf(&b, " | ");
    put_cell(&b, o->doc);
    dlrec_strbuf_printf(&b, " |\n");
  }
  if (b.nomem) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

/* ---- --help ---- */

/* What a flag's value looks like in --help. */
static void help_value(const dlrec_option *o, char *out, size_t size) {
  out[0] = '\0';
  switch (o->type) {
  case DLREC_OPT_BOOL: break;
  case DLREC_OPT_UINT: snprintf(out, size, " N"); break;
  case DLREC_OPT_FLOAT:
  case DLREC_OPT_DOUBLE: snprintf(out, size, " F"); break;
  case DLREC_OPT_CHOICE: {
    size_t n = (size_t)snprintf(out, size, " ");
    for (const dlrec_opt_choice *c = o->choices; c->name && n < size; c++)
      if (!c->alias) n += (size_t)snprintf(out + n, size - n, "%s%s", n > 1 ? "|" : "", c->name);
    break;
  }
  case DLREC_OPT_JSON: snprintf(out, size, " FILE"); break;
  default: { /* the key in capitals */
    size_t n = (size_t)snprintf(out, size, " ");
    for (const char *k = o->key; *k && n + 1 < size; k++) out[n++] = (char)(*k >= 'a' && *k <= 'z' ? *k - 32 : *k);
    out[n] = '\0';
  }
  }
}

void dlrec_options_help(const dlrec_option *table, unsigned where, FILE *out) {
  for (const dlrec_option *o = table; o->key; o++) {
    if (!o->flag || !(o->where & where)) continue;
    char head[96], text[1024];
    const size_t at = (size_t)snprintf(head, sizeof head, "  %s", o->flag);
    help_value(o, head + at, sizeof head - at);
    /* The doc without Markdown's backticks, then the default. */
    size_t n = 0;
    for (const char *p = o->doc; *p && n + 1 < sizeof text; p++)
      if (*p != '`') text[n++] = *p;
    text[n] = '\0';
    if (o->dflt && o->type != DLREC_OPT_BOOL && n + 1 < sizeof text)
      snprintf(text + n, sizeof text - n, " (default %s)", o->dflt);
    else if (o->dflt_doc && n + 1 < sizeof text)
      snprintf(text + n, sizeof text - n, " (default: %s)", o->dflt_doc);
    /* Wrapped at 80 columns, beside the flag from column 27. */
    const char *p = text;
    fprintf(out, "%-26s", head);
    if (strlen(head) >= 26) fprintf(out, "\n%26s", "");
    while (*p) {
      size_t len = strlen(p), cut = len;
      if (len > 54) {
        cut = 54;
        while (cut > 0 && p[cut] != ' ') cut--;
        if (cut == 0) cut = 54;
      }
      fprintf(out, "%.*s\n", (int)cut, p);
      p += cut;
      while (*p == ' ') p++;
      if (*p) fprintf(out, "%26s", "");
    }
  }
}
