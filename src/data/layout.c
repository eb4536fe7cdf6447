/* Row layouts: the fixed Criteo layout, CSV headers, and the schema SPEC
 * (label=NAME;dense=A,B;cat=X..Y;ignore=Z, with * for "all the rest") that
 * assigns CSV header columns their roles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/layout.h"

const char *dlrec_format_name(dlrec_input_format f) {
  switch (f) {
  case DLREC_FORMAT_CRITEO: return "criteo";
  case DLREC_FORMAT_CSV: return "csv";
  case DLREC_FORMAT_LIBSVM: return "libsvm";
  case DLREC_FORMAT_LIBFM: return "libfm";
  }
  return NULL;
}

dlrec_status dlrec_format_parse(const char *s, dlrec_input_format *out) {
  if (!strcmp(s, "criteo")) *out = DLREC_FORMAT_CRITEO;
  else if (!strcmp(s, "csv")) *out = DLREC_FORMAT_CSV;
  else if (!strcmp(s, "libsvm")) *out = DLREC_FORMAT_LIBSVM;
  else if (!strcmp(s, "libfm")) *out = DLREC_FORMAT_LIBFM;
  else return dlrec_error(DLREC_ERR_INVALID, "unknown input format '%s' (expected criteo, csv, libsvm or libfm)", s);
  return DLREC_OK;
}

void dlrec_columns_criteo(dlrec_columns *c, int has_label) {
  memset(c, 0, sizeof *c);
  c->has_label = has_label;
  if (has_label) strcpy(c->label, "label");
  c->n_dense = DLREC_CRITEO_DENSE;
  c->n_cat = DLREC_CRITEO_CAT;
  for (int i = 0; i < DLREC_CRITEO_DENSE; i++) snprintf(c->dense[i], DLREC_NAME_MAX, "I%d", i + 1);
  for (int i = 0; i < DLREC_CRITEO_CAT; i++) snprintf(c->cat[i], DLREC_NAME_MAX, "C%d", i + 1);
}

dlrec_status dlrec_columns_svm(dlrec_columns *c, dlrec_input_format f, uint32_t fields, int has_label,
                               dlrec_pooling pooling, uint32_t max_hotness) {
  memset(c, 0, sizeof *c);
  c->has_label = has_label;
  if (has_label) strcpy(c->label, "label");
  if (f == DLREC_FORMAT_LIBSVM) {
    c->n_cat = 1;
    strcpy(c->cat[0], "features");
  } else if (f == DLREC_FORMAT_LIBFM) {
    if (fields < 1 || fields > DLREC_MAX_SPARSE)
      return dlrec_error(DLREC_ERR_INVALID, "--fields must be in [1, %d] for --format libfm", DLREC_MAX_SPARSE);
    c->n_cat = fields;
    for (uint32_t i = 0; i < fields; i++) snprintf(c->cat[i], DLREC_NAME_MAX, "f%u", i);
  } else {
    return dlrec_error(DLREC_ERR_INTERNAL, "columns_svm: not a libsvm or libfm format");
  }
  for (uint32_t i = 0; i < c->n_cat; i++) {
    c->sep[i] = ' ';
    c->pooling[i] = (uint8_t)pooling;
    c->max_hotness[i] = max_hotness;
  }
  return DLREC_OK;
}

/* ---- the SPEC ---- */

enum { SPEC_LABEL, SPEC_DENSE, SPEC_CAT, SPEC_IGNORE };
static const char *const spec_keys[] = {"label", "dense", "cat", "ignore"};

/* One name of a SPEC list, or "*", with the role it asks for. */
typedef struct spec_item {
  int role;
  char name[256];
} spec_item;

static void trim(const char **b, const char **e) {
  while (*b < *e && (**b == ' ' || **b == '\t')) (*b)++;
  while (*e > *b && ((*e)[-1] == ' ' || (*e)[-1] == '\t')) (*e)--;
}

/* Splits "I12" into prefix "I" and number 12 (digits must end the name). */
static int split_number(const char *s, size_t n, size_t *prefix_len, unsigned long *num, size_t *digits) {
  size_t d = 0;
  while (d < n && s[n - 1 - d] >= '0' && s[n - 1 - d] <= '9') d++;
  if (d == 0 || d > 9) return 0;
  unsigned long v = 0;
  for (size_t i = n - d; i < n; i++) v = v * 10 + (unsigned long)(s[i] - '0');
  *prefix_len = n - d;
  *num = v;
  *digits = d;
  return 1;
}

static dlrec_status add_item(spec_item **items, uint32_t *n, uint32_t *cap, int role, const char *s, size_t len) {
  if (len == 0) return dlrec_error(DLREC_ERR_INVALID, "--schema: empty column name in %s=", spec_keys[role]);
  if (len >= sizeof((*items)->name))
    return dlrec_error(DLREC_ERR_INVALID, "--schema: column name '%.40s...' is too long", s);
  if (*n >= DLREC_LAYOUT_MAX_FIELDS)
    return dlrec_error(DLREC_ERR_INVALID, "--schema: more than %d columns", DLREC_LAYOUT_MAX_FIELDS);
  if (*n == *cap) {
    uint32_t nc = *cap ? *cap * 2 : 64;
    spec_item *ni = realloc(*items, nc * sizeof *ni);
    if (!ni) return dlrec_error(DLREC_ERR_NOMEM, "--schema: out of memory");
    *items = ni;
    *cap = nc;
  }
  (*items)[*n].role = role;
  memcpy((*items)[*n].name, s, len);
  (*items)[*n].name[len] = '\0';
  (*n)++;
  return DLREC_OK;
}

/* One list entry: a name, "*", or a range A..B (B may be only the number). */
static dlrec_status add_entry(spec_item **items, uint32_t *n, uint32_t *cap, int role, const char *b, const char *e) {
  const char *dots = NULL;
  for (const char *p = b; p + 1 < e; p++)
    if (p[0] == '.' && p[1] == '.') {
      dots = p;
      break;
    }
  if (!dots) return add_item(items, n, cap, role, b, (size_t)(e - b));
  const char *lb = b, *le = dots, *rb = dots + 2, *re = e;
  trim(&lb, &le);
  trim(&rb, &re);
  size_t lp, rp, ld, rd;
  unsigned long lo, hi;
  if (!split_number(lb, (size_t)(le - lb), &lp, &lo, &ld) || !split_number(rb, (size_t)(re - rb), &rp, &hi, &rd) ||
      (rp != 0 && (rp != lp || memcmp(lb, rb, lp) != 0)) || lo > hi)
    return dlrec_error(DLREC_ERR_INVALID,
                       "--schema: bad range '%.*s' (expected NAME<a>..NAME<b> or NAME<a>..<b> with a <= b, "
                       "e.g. I1..I13)",
                       (int)(e - b), b);
  if (hi - lo >= DLREC_LAYOUT_MAX_FIELDS)
    return dlrec_error(DLREC_ERR_INVALID, "--schema: range '%.*s' is too long", (int)(e - b), b);
  /* A zero-padded start ("C01") keeps its width. */
  int width = (ld > 1 && lb[lp] == '0') ? (int)ld : 1;
  for (unsigned long v = lo; v <= hi; v++) {
    char name[300];
    int len = snprintf(name, sizeof name, "%.*s%0*lu", (int)lp, lb, width, v);
    if (len < 0 || (size_t)len >= sizeof name) return dlrec_error(DLREC_ERR_INVALID, "--schema: name too long");
    dlrec_status st = add_item(items, n, cap, role, name, (size_t)len);
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

static dlrec_status parse_spec(const char *spec, spec_item **items, uint32_t *n_items) {
  uint32_t cap = 0;
  *items = NULL;
  *n_items = 0;
  const char *p = spec;
  int n_labels = 0;
  while (*p) {
    const char *semi = strchr(p, ';');
    const char *e = semi ? semi : p + strlen(p);
    const char *b = p;
    trim(&b, &e);
    if (b < e) {
      const char *eq = memchr(b, '=', (size_t)(e - b));
      if (!eq)
        return dlrec_error(DLREC_ERR_INVALID, "--schema: '%.*s' is not KEY=VALUE (keys: label, dense, cat, ignore, multi)",
                           (int)(e - b), b);
      const char *kb = b, *ke = eq;
      trim(&kb, &ke);
      int role = -1;
      for (int k = 0; k < 4; k++)
        if ((size_t)(ke - kb) == strlen(spec_keys[k]) && !memcmp(kb, spec_keys[k], (size_t)(ke - kb))) role = k;
      if (role < 0)
        return dlrec_error(DLREC_ERR_INVALID, "--schema: unknown key '%.*s' (keys: label, dense, cat, ignore, multi)",
                           (int)(ke - kb), kb);
      const char *v = eq + 1;
      uint32_t before = *n_items;
      while (v <= e) {
        const char *comma = memchr(v, ',', (size_t)(e - v));
        const char *ve = comma ? comma : e;
        const char *ib = v, *ie = ve;
        trim(&ib, &ie);
        dlrec_status st = add_entry(items, n_items, &cap, role, ib, ie);
        if (st != DLREC_OK) return st;
        v = ve + 1;
      }
      if (role == SPEC_LABEL) {
        n_labels += (int)(*n_items - before);
        if (n_labels != 1 || !strcmp((*items)[*n_items - 1].name, "*"))
          return dlrec_error(DLREC_ERR_INVALID, "--schema: label= takes exactly one column name");
      }
    }
    if (!semi) break;
    p = semi + 1;
  }
  if (*n_items == 0) return dlrec_error(DLREC_ERR_INVALID, "--schema: empty (expected e.g. 'label=click;cat=*')");
  return DLREC_OK;
}

static int find_name(const char *const *names, uint32_t n, const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return (int)i;
  return -1;
}

static dlrec_status put_name(char *dst, const char *name, const char *role) {
  if (strlen(name) >= DLREC_NAME_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "--schema: %s column name '%s' is longer than %d bytes", role, name,
                       DLREC_NAME_MAX - 1);
  strcpy(dst, name);
  return DLREC_OK;
}

/* Gives header column h the role of item `it`, in the order the items come. */
static dlrec_status take(dlrec_columns *c, int role, const char *name) {
  if (role == SPEC_LABEL) {
    c->has_label = 1;
    return put_name(c->label, name, "label");
  }
  if (role == SPEC_DENSE) {
    if (c->n_dense >= DLREC_MAX_DENSE)
      return dlrec_error(DLREC_ERR_INVALID, "--schema: more than %d dense columns", DLREC_MAX_DENSE);
    return put_name(c->dense[c->n_dense++], name, "dense");
  }
  if (role == SPEC_CAT) {
    if (c->n_cat >= DLREC_MAX_SPARSE)
      return dlrec_error(DLREC_ERR_INVALID, "--schema: more than %d categorical columns", DLREC_MAX_SPARSE);
    return put_name(c->cat[c->n_cat++], name, "categorical");
  }
  return DLREC_OK;
}

/* One multi= entry: NAME:SEP[:POOL[:MAX]]. */
typedef struct multi_decl {
  char name[256];
  char sep;
  uint8_t pooling;
  uint32_t max_hotness;
} multi_decl;

static dlrec_status parse_multi_entry(const char *b, const char *e, multi_decl *m) {
  memset(m, 0, sizeof *m);
  const char *colon = memchr(b, ':', (size_t)(e - b));
  const char *nb = b, *ne = colon ? colon : e;
  trim(&nb, &ne);
  if (!colon || ne == nb || colon + 1 >= e || (colon + 2 < e && colon[2] != ':'))
    return dlrec_error(DLREC_ERR_INVALID,
                       "--schema: bad multi= entry '%.*s' (expected NAME:SEP[:sum|mean[:MAX]] with SEP one byte, "
                       "e.g. multi=genres:|)",
                       (int)(e - b), b);
  if ((size_t)(ne - nb) >= sizeof m->name)
    return dlrec_error(DLREC_ERR_INVALID, "--schema: column name '%.40s...' is too long", nb);
  memcpy(m->name, nb, (size_t)(ne - nb));
  m->sep = colon[1];
  if (m->sep == ' ' || m->sep == '\t' || m->sep == '"')
    return dlrec_error(DLREC_ERR_INVALID, "--schema: multi=%s: the separator may not be a space, tab or quote",
                       m->name);
  const char *p = colon + 2;
  if (p < e) {
    p++; /* the ':' */
    const char *pe = memchr(p, ':', (size_t)(e - p));
    if (!pe) pe = e;
    dlrec_pooling pool;
    if (dlrec_pooling_parse(p, (size_t)(pe - p), &pool) == 0) m->pooling = pool;
    else
      return dlrec_error(DLREC_ERR_INVALID, "--schema: multi=%s: pooling '%.*s' is not sum or mean", m->name,
                         (int)(pe - p), p);
    if (pe < e) {
      unsigned long long v = 0;
      const char *q = pe + 1;
      int digits = 0;
      for (; q < e && *q >= '0' && *q <= '9' && digits < 10; q++, digits++) v = v * 10 + (unsigned)(*q - '0');
      if (digits == 0 || q != e || v < 1 || v > 65536)
        return dlrec_error(DLREC_ERR_INVALID, "--schema: multi=%s: max hotness '%.*s' is not in [1, 65536]",
                           m->name, (int)(e - pe - 1), pe + 1);
      m->max_hotness = (uint32_t)v;
    }
  }
  return DLREC_OK;
}

/* Takes the multi= clauses out of spec: the rest goes to *rest (malloc'd),
 * the entries to *decls (malloc'd). */
static dlrec_status extract_multi(const char *spec, char **rest, multi_decl **decls, uint32_t *n_decls) {
  size_t len = strlen(spec);
  *rest = malloc(len + 2);
  *decls = NULL;
  *n_decls = 0;
  if (!*rest) return dlrec_error(DLREC_ERR_NOMEM, "--schema: out of memory");
  char *out = *rest;
  const char *p = spec;
  uint32_t cap = 0;
  while (*p) {
    const char *semi = strchr(p, ';');
    const char *e = semi ? semi : p + strlen(p);
    const char *b = p, *eq = memchr(p, '=', (size_t)(e - p));
    const char *kb = b, *ke = eq ? eq : e;
    trim(&kb, &ke);
    if (eq && ke - kb == 5 && !memcmp(kb, "multi", 5)) {
      const char *v = eq + 1;
      while (v <= e) {
        const char *comma = memchr(v, ',', (size_t)(e - v));
        const char *ve = comma ? comma : e, *ib = v, *ie = ve;
        trim(&ib, &ie);
        if (*n_decls == cap) {
          cap = cap ? 2 * cap : 8;
          multi_decl *nd = realloc(*decls, cap * sizeof *nd);
          if (!nd) return dlrec_error(DLREC_ERR_NOMEM, "--schema: out of memory");
          *decls = nd;
        }
        dlrec_status st = parse_multi_entry(ib, ie, &(*decls)[(*n_decls)++]);
        if (st != DLREC_OK) return st;
        v = ve + 1;
      }
    } else {
      memcpy(out, p, (size_t)(e - p));
      out += e - p;
      *out++ = ';';
    }
    if (!semi) break;
    p = semi + 1;
  }
  *out = '\0';
  return DLREC_OK;
}

/* Marks the declared multi-hot columns, which must be categorical. */
static dlrec_status apply_multi(dlrec_columns *c, const multi_decl *m, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    uint32_t k = 0;
    while (k < c->n_cat && strcmp(c->cat[k], m[i].name)) k++;
    if (k == c->n_cat)
      return dlrec_error(DLREC_ERR_INVALID, "--schema: multi=%s: not a categorical column (name it in cat= too)",
                         m[i].name);
    if (c->sep[k]) return dlrec_error(DLREC_ERR_INVALID, "--schema: multi=%s appears twice", m[i].name);
    c->sep[k] = m[i].sep;
    c->pooling[k] = m[i].pooling;
    c->max_hotness[k] = m[i].max_hotness;
  }
  return DLREC_OK;
}

static dlrec_status columns_from_spec(dlrec_columns *c, const char *spec, const char *const *header,
                                      uint32_t n_header);

dlrec_status dlrec_columns_from_spec(dlrec_columns *c, const char *spec, const char *const *header,
                                     uint32_t n_header) {
  char *rest;
  multi_decl *decls;
  uint32_t n_decls;
  memset(c, 0, sizeof *c);
  dlrec_status st = extract_multi(spec, &rest, &decls, &n_decls);
  if (st == DLREC_OK) st = columns_from_spec(c, rest, header, n_header);
  if (st == DLREC_OK) st = apply_multi(c, decls, n_decls);
  free(rest);
  free(decls);
  return st;
}

static dlrec_status columns_from_spec(dlrec_columns *c, const char *spec, const char *const *header,
                                      uint32_t n_header) {
  memset(c, 0, sizeof *c);
  if (n_header > DLREC_LAYOUT_MAX_FIELDS)
    return dlrec_error(DLREC_ERR_INVALID, "header: %u columns, at most %d", n_header, DLREC_LAYOUT_MAX_FIELDS);
  for (uint32_t i = 0; i < n_header; i++) {
    int j = find_name(header, i, header[i]);
    if (j >= 0)
      return dlrec_error(DLREC_ERR_INVALID, "header: column '%s' appears twice (columns %d and %u)", header[i], j + 1,
                         i + 1);
  }
  spec_item *items;
  uint32_t n_items;
  dlrec_status st = parse_spec(spec, &items, &n_items);
  int *owner = calloc(n_header ? n_header : 1, sizeof *owner); /* item index + 1 per header column */
  if (st == DLREC_OK && !owner) st = dlrec_error(DLREC_ERR_NOMEM, "--schema: out of memory");
  int star_role = -1;
  for (uint32_t i = 0; st == DLREC_OK && i < n_items; i++) {
    if (!strcmp(items[i].name, "*")) {
      if (star_role >= 0) st = dlrec_error(DLREC_ERR_INVALID, "--schema: '*' may appear only once");
      star_role = items[i].role;
      continue;
    }
    int h = find_name(header, n_header, items[i].name);
    if (h < 0) st = dlrec_error(DLREC_ERR_INVALID, "--schema: column '%s' is not in the header", items[i].name);
    else if (owner[h])
      st = dlrec_error(DLREC_ERR_INVALID, "--schema: column '%s' is named twice (%s= and %s=)", items[i].name,
                       spec_keys[items[owner[h] - 1].role], spec_keys[items[i].role]);
    else owner[h] = (int)i + 1;
  }
  /* Roles in SPEC order, with * expanding in header order where it stands. */
  for (uint32_t i = 0; st == DLREC_OK && i < n_items; i++) {
    if (strcmp(items[i].name, "*") != 0) {
      st = take(c, items[i].role, items[i].name);
      continue;
    }
    for (uint32_t h = 0; st == DLREC_OK && h < n_header; h++)
      if (!owner[h]) {
        owner[h] = (int)i + 1;
        st = take(c, items[i].role, header[h]);
      }
  }
  for (uint32_t h = 0; st == DLREC_OK && h < n_header; h++)
    if (!owner[h])
      st = dlrec_error(DLREC_ERR_INVALID,
                       "--schema: header column '%s' (column %u) has no role: name it in ignore= or use * "
                       "(e.g. cat=*)",
                       header[h], h + 1);
  if (st == DLREC_OK && c->n_dense + c->n_cat == 0)
    st = dlrec_error(DLREC_ERR_INVALID, "--schema: no dense or categorical columns");
  free(owner);
  free(items);
  return st;
}

/* ---- CSV header ---- */

dlrec_status dlrec_csv_split_header(const char *line, size_t n, const char *file, char ***names, uint32_t *n_names) {
  *names = NULL;
  *n_names = 0;
  if (n && line[n - 1] == '\r') n--;
  dlrec_text *fields = malloc(DLREC_LAYOUT_MAX_FIELDS * sizeof *fields);
  char *scratch = malloc(n + 1);
  if (!fields || !scratch) {
    free(fields), free(scratch);
    return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", file);
  }
  dlrec_where w = {file, 1};
  uint32_t nf = 0;
  dlrec_status st = dlrec__csv_split(line, n, scratch, fields, DLREC_LAYOUT_MAX_FIELDS, &nf, NULL, &w);
  char **out = NULL;
  if (st == DLREC_OK) {
    size_t bytes = nf * sizeof(char *);
    for (uint32_t i = 0; i < nf; i++) bytes += fields[i].n + 1;
    out = malloc(bytes);
    if (!out) st = dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", file);
  }
  char *p = out ? (char *)(out + nf) : NULL;
  for (uint32_t i = 0; st == DLREC_OK && i < nf; i++) {
    const dlrec_text t = fields[i];
    if (t.n == 0) st = dlrec_error(DLREC_ERR_PARSE, "%s:1: header column %u has an empty name", file, i + 1);
    out[i] = p;
    memcpy(p, t.s, t.n);
    p[t.n] = '\0';
    p += t.n + 1;
  }
  if (st == DLREC_OK) {
    *names = out;
    *n_names = nf;
  } else {
    free(out);
  }
  free(fields), free(scratch);
  return st;
}

/* ---- layouts ---- */

static dlrec_status names_alloc(dlrec_layout *L, size_t bytes) {
  L->names_block = malloc(bytes);
  L->ignored = calloc(1, bytes + 1);
  if (!L->names_block || !L->ignored) return dlrec_error(DLREC_ERR_NOMEM, "layout: out of memory");
  return DLREC_OK;
}

dlrec_status dlrec_layout_criteo(dlrec_layout **out, int has_label) {
  *out = NULL;
  dlrec_layout *L = calloc(1, sizeof *L);
  if (!L) return dlrec_error(DLREC_ERR_NOMEM, "layout: out of memory");
  dlrec_columns c;
  dlrec_columns_criteo(&c, has_label);
  L->format = DLREC_FORMAT_CRITEO;
  L->has_label = has_label;
  L->n_dense = c.n_dense;
  L->n_cat = c.n_cat;
  L->n_fields = (has_label ? 1 : 0) + c.n_dense + c.n_cat;
  if (names_alloc(L, (size_t)L->n_fields * 8) != DLREC_OK) {
    dlrec_layout_free(L);
    return DLREC_ERR_NOMEM;
  }
  char *p = L->names_block;
  uint32_t f = 0;
  L->label_field = UINT32_MAX;
  if (has_label) {
    L->label_field = f;
    L->role[f] = DLREC_ROLE_LABEL;
    L->names[f++] = strcpy(p, "label");
    p += 6;
  }
  for (uint32_t i = 0; i < c.n_dense; i++, f++) {
    L->dense_field[i] = f;
    L->role[f] = DLREC_ROLE_DENSE;
    L->index[f] = (uint16_t)i;
    L->names[f] = strcpy(p, c.dense[i]);
    p += strlen(p) + 1;
  }
  for (uint32_t i = 0; i < c.n_cat; i++, f++) {
    L->cat_field[i] = f;
    L->role[f] = DLREC_ROLE_CAT;
    L->index[f] = (uint16_t)i;
    L->names[f] = strcpy(p, c.cat[i]);
    p += strlen(p) + 1;
  }
  *out = L;
  return DLREC_OK;
}

dlrec_status dlrec_layout_svm(dlrec_layout **out, const dlrec_columns *c, dlrec_input_format f, int has_label) {
  *out = NULL;
  if (f != DLREC_FORMAT_LIBSVM && f != DLREC_FORMAT_LIBFM)
    return dlrec_error(DLREC_ERR_INTERNAL, "layout_svm: not a libsvm or libfm format");
  dlrec_layout *L = calloc(1, sizeof *L);
  if (!L) return dlrec_error(DLREC_ERR_NOMEM, "layout: out of memory");
  /* Items have no fixed field: messages name an item by its position on the
   * line (the label is field 1) and its column by name. */
  L->format = f;
  L->has_label = has_label;
  L->n_cat = c->n_cat;
  L->n_fields = (has_label ? 1 : 0) + c->n_cat;
  if (names_alloc(L, (size_t)L->n_fields * DLREC_NAME_MAX) != DLREC_OK) {
    dlrec_layout_free(L);
    return DLREC_ERR_NOMEM;
  }
  char *p = L->names_block;
  uint32_t k = 0;
  L->label_field = UINT32_MAX;
  if (has_label) {
    L->label_field = 0;
    L->role[k] = DLREC_ROLE_LABEL;
    L->names[k++] = strcpy(p, "label");
    p += 6;
  }
  for (uint32_t i = 0; i < c->n_cat; i++, k++) {
    L->cat_field[i] = k;
    L->sep[i] = ' ';
    L->role[k] = DLREC_ROLE_CAT;
    L->index[k] = (uint16_t)i;
    L->names[k] = strcpy(p, c->cat[i]);
    p += strlen(p) + 1;
  }
  *out = L;
  return DLREC_OK;
}

dlrec_status dlrec_layout_csv(dlrec_layout **out, const dlrec_columns *c, int has_label, const char *header,
                              size_t header_bytes, const char *file) {
  *out = NULL;
  if (has_label && !c->has_label) return dlrec_error(DLREC_ERR_INTERNAL, "layout: label wanted but not defined");
  char **names;
  uint32_t nh;
  dlrec_status st = dlrec_csv_split_header(header, header_bytes, file, &names, &nh);
  if (st != DLREC_OK) return st;
  dlrec_layout *L = calloc(1, sizeof *L);
  size_t bytes = 1;
  for (uint32_t i = 0; i < nh; i++) bytes += strlen(names[i]) + 1;
  if (!L || names_alloc(L, bytes) != DLREC_OK) {
    free(names);
    dlrec_layout_free(L);
    return dlrec_error(DLREC_ERR_NOMEM, "layout: out of memory");
  }
  L->format = DLREC_FORMAT_CSV;
  L->has_label = has_label;
  L->n_fields = nh;
  L->n_dense = c->n_dense;
  L->n_cat = c->n_cat;
  L->label_field = UINT32_MAX;
  char *p = L->names_block;
  for (uint32_t i = 0; i < nh; i++) {
    L->names[i] = strcpy(p, names[i]);
    p += strlen(p) + 1;
  }
  for (uint32_t i = 0; i < c->n_dense; i++) L->dense_field[i] = UINT32_MAX;
  for (uint32_t i = 0; i < c->n_cat; i++) L->cat_field[i] = UINT32_MAX;
  /* Find each column of c by name; the header has no duplicates (checked). */
  for (uint32_t h = 0; st == DLREC_OK && h < nh; h++) {
    int j = find_name((const char *const *)names, h, names[h]);
    if (j >= 0)
      st = dlrec_error(DLREC_ERR_PARSE, "%s:1: header column '%s' appears twice (columns %d and %u)", file, names[h],
                       j + 1, h + 1);
    L->role[h] = DLREC_ROLE_IGNORE;
    if (has_label && !strcmp(names[h], c->label)) {
      L->role[h] = DLREC_ROLE_LABEL;
      L->label_field = h;
      continue;
    }
    for (uint32_t i = 0; i < c->n_dense; i++)
      if (!strcmp(names[h], c->dense[i])) {
        L->role[h] = DLREC_ROLE_DENSE;
        L->index[h] = (uint16_t)i;
        L->dense_field[i] = h;
      }
    for (uint32_t i = 0; i < c->n_cat; i++)
      if (!strcmp(names[h], c->cat[i])) {
        L->role[h] = DLREC_ROLE_CAT;
        L->index[h] = (uint16_t)i;
        L->cat_field[i] = h;
        L->sep[i] = c->sep[i];
      }
    if (L->role[h] == DLREC_ROLE_IGNORE) {
      if (L->ignored[0]) strcat(L->ignored, ",");
      strcat(L->ignored, names[h]);
    }
  }
  if (st == DLREC_OK && has_label && L->label_field == UINT32_MAX)
    st = dlrec_error(DLREC_ERR_PARSE, "%s:1: header has no label column '%s'", file, c->label);
  for (uint32_t i = 0; st == DLREC_OK && i < c->n_dense; i++)
    if (L->dense_field[i] == UINT32_MAX)
      st = dlrec_error(DLREC_ERR_PARSE, "%s:1: header has no dense column '%s'", file, c->dense[i]);
  for (uint32_t i = 0; st == DLREC_OK && i < c->n_cat; i++)
    if (L->cat_field[i] == UINT32_MAX)
      st = dlrec_error(DLREC_ERR_PARSE, "%s:1: header has no categorical column '%s'", file, c->cat[i]);
  free(names);
  if (st != DLREC_OK) {
    dlrec_layout_free(L);
    return st;
  }
  *out = L;
  return DLREC_OK;
}

void dlrec_layout_free(dlrec_layout *L) {
  if (!L) return;
  free(L->names_block);
  free(L->ignored);
  free(L);
}

int dlrec_layout_has_label(const dlrec_layout *L) { return L->has_label; }
uint32_t dlrec_layout_fields(const dlrec_layout *L) { return L->n_fields; }
uint32_t dlrec_layout_n_dense(const dlrec_layout *L) { return L->n_dense; }
uint32_t dlrec_layout_n_cat(const dlrec_layout *L) { return L->n_cat; }
const char *dlrec_layout_field_name(const dlrec_layout *L, uint32_t i) {
  return i < L->n_fields && L->names[i] ? L->names[i] : "";
}
const char *dlrec_layout_ignored(const dlrec_layout *L) { return L->ignored ? L->ignored : ""; }
uint32_t dlrec_layout_dense_field(const dlrec_layout *L, uint32_t i) { return L->dense_field[i]; }
uint32_t dlrec_layout_cat_field(const dlrec_layout *L, uint32_t i) { return L->cat_field[i]; }
