/* The backend registry and what every backend shares: creation by name,
 * the precision's names, the default backend. */
#include "backend/backend_impl.h"
#include "backend/cpu/cpu_gemm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <pthread.h>

const char *dlrec_precision_name(dlrec_precision p) {
  switch (p) {
  case DLREC_PRECISION_FP32: return "fp32";
  case DLREC_PRECISION_BF16: return "bf16";
  case DLREC_PRECISION_AUTO: return "auto";
  case DLREC_PRECISION_TF32: return "tf32";
  case DLREC_PRECISION_FP16: return "fp16";
  }
  return "?";
}

dlrec_status dlrec_precision_parse(const char *s, dlrec_precision *p) {
  for (int i = DLREC_PRECISION_FP32; i <= DLREC_PRECISION_FP16; i++)
    if (s && !strcmp(s, dlrec_precision_name((dlrec_precision)i))) {
      *p = (dlrec_precision)i;
      return DLREC_OK;
    }
  return dlrec_error(DLREC_ERR_INVALID, "precision '%s' is not one of fp32, bf16, auto, tf32, fp16", s ? s : "(null)");
}

dlrec_precision dlrec_precision_resolve(const char *backend, dlrec_precision p) {
  if (backend && !strcmp(backend, "cuda")) /* every GPU this build targets has bf16 tensor cores */
    return p == DLREC_PRECISION_AUTO ? DLREC_PRECISION_BF16 : p;
  if (p == DLREC_PRECISION_AUTO) return cpu_gemm_has_bf16() ? DLREC_PRECISION_BF16 : DLREC_PRECISION_FP32;
  return p == DLREC_PRECISION_TF32 ? DLREC_PRECISION_FP32 : p; /* a GPU's unit: fp32 on the CPU */
}

typedef struct backend_entry {
  const char *name;
  dlrec_status (*init)(dlrec_backend *be, const dlrec_backend_config *c);
} backend_entry;

static const backend_entry g_backends[] = {
    {"cpu", dlrec_backend_cpu_init},
#ifdef DLREC_HAVE_CUDA
    {"cuda", dlrec_backend_cuda_init},
#endif
};
#define N_BACKENDS (sizeof g_backends / sizeof g_backends[0])
static const backend_entry g_cpu_mirror = {"cpu-mirror", dlrec_backend_cpu_mirror_init};

/* Why a build has no "cuda" backend, in each message that says so. */
#define NO_CUDA "built without the CUDA toolkit"


const char *dlrec_backend_name_at(size_t i) { return i < N_BACKENDS ? g_backends[i].name : NULL; }

dlrec_status dlrec_backend_create(dlrec_backend **out, const char *name, const dlrec_backend_config *c) {
  *out = NULL;
  dlrec_backend_config def = {0, DLREC_PRECISION_FP32, 0};
  if (!c) c = &def;
  if (c->precision < DLREC_PRECISION_FP32 || c->precision > DLREC_PRECISION_FP16)
    return dlrec_error(DLREC_ERR_INVALID, "backend precision %d is not fp32, bf16, auto, tf32 or fp16",
                       (int)c->precision);
  for (size_t i = 0; i <= N_BACKENDS; i++) {
    /* Past the listed ones, the unlisted test backend. */
    const backend_entry *e = i < N_BACKENDS ? &g_backends[i] : &g_cpu_mirror;
    if (!name || strcmp(name, e->name)) continue;
    dlrec_backend *be = calloc(1, sizeof *be);
    if (!be) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    dlrec_status s = e->init(be, c);
    if (s != DLREC_OK) {
      free(be);
      return s;
    }
    *out = be;
    return DLREC_OK;
  }
  char have[128] = "";
  for (size_t i = 0; i < N_BACKENDS; i++)
    snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "", g_backends[i].name);
  return dlrec_error(DLREC_ERR_INVALID, "no backend '%s' in this build (it has: %s)%s", name ? name : "(null)", have,
                     name && !strcmp(name, "cuda") ? "; it was " NO_CUDA " (nvcc)" : "");
}

dlrec_status dlrec_device_parse(const char *s, const char **backend, uint32_t *index) {
  /* "cpu-mirror" too: the test backend (backend_impl.h), not in the list below. */
  if (s && (!strcmp(s, "cpu") || !strcmp(s, "cpu-mirror"))) {
    *backend = s[3] ? "cpu-mirror" : "cpu";
    *index = 0;
    return DLREC_OK;
  }
  if (s && !strncmp(s, "cuda", 4)) {
    const char *p = s + 4;
    unsigned long n = 0;
    int ok = *p == '\0';
    if (*p == ':' && p[1] >= '0' && p[1] <= '9' && strlen(p + 1) <= 4) {
      char *end;
      n = strtoul(p + 1, &end, 10);
      ok = *end == '\0';
    }
    if (ok) {
      *backend = "cuda";
      *index = (uint32_t)n;
      return DLREC_OK;
    }
  }
  return dlrec_error(DLREC_ERR_INVALID, "device '%s' is not one of cpu, cuda, cuda:N (N the GPU's index)",
                     s ? s : "(null)");
}

dlrec_status dlrec_backend_create_on(dlrec_backend **be, const char *device, const dlrec_backend_config *c) {
  *be = NULL;
  const char *name = "cpu";
  dlrec_backend_config dc = c ? *c : (dlrec_backend_config){0, DLREC_PRECISION_FP32, 0};
  if (device) {
    dlrec_status s = dlrec_device_parse(device, &name, &dc.device);
    if (s != DLREC_OK) return s;
  }
  return dlrec_backend_create(be, name, &dc);
}

/* MemTotal and MemAvailable from /proc/meminfo, in bytes. */
static dlrec_status cpu_memory(uint64_t *total, uint64_t *available) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return dlrec_error(DLREC_ERR_UNSUPPORTED, "the machine's memory: cannot read /proc/meminfo");
  char line[256];
  unsigned long long kib;
  int have = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) *total = kib * 1024ull, have |= 1;
    else if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) *available = kib * 1024ull, have |= 2;
  }
  fclose(f);
  return have == 3 ? DLREC_OK
                   : dlrec_error(DLREC_ERR_UNSUPPORTED, "the machine's memory: /proc/meminfo has no MemTotal and "
                                 "MemAvailable");
}

/* cpu-mirror, a test device, has the host's memory, or DLREC_MIRROR_MEMORY_MB
 * (MiB, fractions allowed) as both its total and what is available, so
 * that a test can give it less than a table needs (training.table_placement
 * auto). It reports that size; its allocations are not held to it. */
static dlrec_status mirror_memory(uint64_t *total, uint64_t *available) {
  const char *mb = getenv("DLREC_MIRROR_MEMORY_MB");
  if (!mb || !*mb) return cpu_memory(total, available);
  char *end = NULL;
  const double v = strtod(mb, &end);
  if (*end || !(v >= 0 && v < 1e9))
    return dlrec_error(DLREC_ERR_INVALID, "DLREC_MIRROR_MEMORY_MB '%s' is not a size in MiB", mb);
  *total = *available = (uint64_t)(v * 1048576.0);
  return DLREC_OK;
}

dlrec_status dlrec_device_memory(const char *device, uint64_t *total, uint64_t *available) {
  const char *name;
  uint32_t index;
  dlrec_status s = dlrec_device_parse(device, &name, &index);
  if (s != DLREC_OK) return s;
  if (!strcmp(name, "cpu-mirror")) return mirror_memory(total, available);
  if (strncmp(name, "cuda", 4)) return cpu_memory(total, available); /* cpu */
#ifdef DLREC_HAVE_CUDA
  return backend_cuda_memory(index, total, available);
#else
  return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: this build has no CUDA backend (" NO_CUDA ")",
                     device);
#endif
}

void dlrec_backend_devices(const char *name, char *buf, size_t size) {
  if (name && !strcmp(name, "cpu")) {
    int n = snprintf(buf, size, "%d cores", omp_get_num_procs());
    static const dlrec_precision precisions[] = {DLREC_PRECISION_FP32, DLREC_PRECISION_BF16};
    for (size_t i = 0; i < 2 && n >= 0 && (size_t)n < size; i++) {
      cpu_gemm *g = NULL;
      int native = 0;
      if (cpu_gemm_create(&g, precisions[i], &native) == DLREC_OK)
        n += snprintf(buf + n, size - (size_t)n, "; %s", cpu_gemm_describe(g));
      else /* an engine refused (a bad DLREC_FP32_GEMM, say): say why */
        n += snprintf(buf + n, size - (size_t)n, "; %s", dlrec_last_error());
      dlrec_clear_error();
      cpu_gemm_free(g);
    }
    return;
  }
#ifdef DLREC_HAVE_CUDA
  if (name && !strcmp(name, "cuda")) {
    backend_cuda_devices(buf, size);
    return;
  }
#endif
  snprintf(buf, size, "not in this build%s",
           name && !strcmp(name, "cuda") ? " (" NO_CUDA ")" : "");
}

void dlrec_backend_free(dlrec_backend *be) {
  if (!be) return;
  if (be->ops && be->ops->free) be->ops->free(be);
  free(be);
}

const char *dlrec_backend_name(const dlrec_backend *be) { return be->name; }
uint32_t dlrec_backend_threads(const dlrec_backend *be) { return be->threads; }
uint32_t dlrec_backend_device_index(const dlrec_backend *be) { return be->device; }
dlrec_precision dlrec_backend_precision(const dlrec_backend *be) { return be->precision; }
int dlrec_backend_bf16_native(const dlrec_backend *be) { return be->bf16_native; }
int dlrec_backend_host_memory(const dlrec_backend *be) { return be->host_memory; }
const char *dlrec_backend_describe(const dlrec_backend *be) { return be->describe; }

uint32_t backend_split_ways(const dlrec_backend *be) {
  return !strcmp(be->name, "cpu") ? be->threads : 1;
}

dlrec_status backend_lane_create(const dlrec_backend *be, dlrec_backend **lane) {
  dlrec_backend_config c = {1, be->precision, be->device};
  return dlrec_backend_create(lane, be->name, &c);
}

/* Static storage: the default backend cannot fail to exist. */
static dlrec_backend g_default;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

static void create_default(void) {
  dlrec_backend_config c = {0, DLREC_PRECISION_FP32, 0};
  (void)dlrec_backend_cpu_init(&g_default, &c); /* fp32 on every core: nothing that can fail */
}

dlrec_backend *dlrec_backend_default(void) {
  pthread_once(&g_default_once, create_default);
  return &g_default;
}
