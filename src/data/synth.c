/* The synthetic click-log generator: the hidden model and one chunk of rows.
 *
 * A row is drawn column by column from one random stream, its true click
 * probability computed from the hidden logit, its label drawn from that
 * probability, and the row formatted as Criteo text by hand (no printf). The
 * model's weights are never stored: each is a hash of (model seed, column,
 * value rank), so a column of ten million values costs nothing to hold and
 * generation runs from a few kilobytes of state. docs/synth.md describes the
 * model for users; the comments here say why it is built this way.
 */
#include "data/synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/rng.h"

/* A row takes some 80 random numbers, and calls to the out-of-line
 * dlrec_rng_u64 cost a tenth of the generator's time: this is its
 * xoshiro256** step, inlined, on the same state (seeded by dlrec_rng_seed). */
static inline uint64_t next_u64(dlrec_rng *r) {
  uint64_t *s = r->s;
  uint64_t x = s[1] * 5;
  uint64_t result = ((x << 7) | (x >> 57)) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = (s[3] << 45) | (s[3] >> 19);
  return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double next_uniform(dlrec_rng *r) { return (double)(next_u64(r) >> 11) * 0x1.0p-53; }

/* ---- Column shapes (Criteo Kaggle, train.txt, 45.8M rows) ---- */

/* Missing rates of I1..I13. */
static const double dense_missing[DLREC_SYNTH_DENSE] = {
    0.45, 0.0, 0.21, 0.22, 0.026, 0.22, 0.04, 0.0005, 0.04, 0.45, 0.04, 0.77, 0.22,
};
/* The counts are log-normal-ish: log2(1 + x) ~ Normal(mu, sd), discretized to
 * octaves and uniform within one. Chosen so the medians and maxima resemble
 * Criteo's (I5 in the thousands to millions, I12 mostly 0). */
static const double dense_mu[DLREC_SYNTH_DENSE] = {1.0, 2.5, 3.0, 2.4, 11.0, 5.0, 2.0, 3.2, 5.5, 0.6, 1.3, 0.2, 2.4};
static const double dense_sd[DLREC_SYNTH_DENSE] = {1.3, 2.5, 1.8, 1.3, 3.0, 2.2, 1.6, 1.4, 2.0, 0.8, 1.2, 0.8, 1.5};
/* I2 (index 1) is the one column with negative values in Criteo, down to -3. */
#define I2_NEG_1 0.05  /* share of -1 */
#define I2_NEG_2 0.004 /* share of -2 */
#define I2_NEG_3 0.001 /* share of -3 */

static const uint32_t criteo_cardinality[DLREC_SYNTH_CAT] = {
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,  /* C1..C13 */
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,       /* C14..C26 */
};
/* Criteo 1TB's vocabulary sizes at frequency threshold 15, C1..C26, as
 * DeepLearningExamples' DLRM preprocessing makes them. */
static const uint32_t criteo_1tb_cardinality[DLREC_SYNTH_CAT] = {
    7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11,      /* C1..C13 */
    2209, 10667, 104, 4, 968, 15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35,          /* C14..C26 */
};
/* Missing rates of C1..C26. In Criteo two groups of columns go missing
 * together (the same rows): 3.4% of rows miss C3, C4, C12, C16, C21 and C24;
 * 44% miss C19, C20, C25 and C26. Group members share one draw. */
static const double cat_missing[DLREC_SYNTH_CAT] = {
    0, 0, 0.034, 0.034, 0, 0.121, 0, 0, 0, 0, 0, 0.034, 0,        /* C1..C13 */
    0, 0, 0.034, 0, 0, 0.44, 0.44, 0.034, 0.763, 0, 0.034, 0.44, 0.44, /* C14..C26 */
};
static const int8_t cat_missing_group[DLREC_SYNTH_CAT] = {
    -1, -1, 0, 0, -1, -1, -1, -1, -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, 1, 1, 0, -1, -1, 0, 1, 1,
};
static const double group_missing[2] = {0.034, 0.44};
/* Zipf exponents: value rank k has frequency proportional to k^-s. Large
 * columns are flatter (long tails of rare ids), small ones more skewed. */
static const double cat_zipf_s[DLREC_SYNTH_CAT] = {
    1.10, 1.10, 1.05, 1.05, 1.15, 1.20, 1.10, 1.15, 1.20, 1.08, 1.10, 1.05, 1.10,
    1.20, 1.10, 1.05, 1.20, 1.10, 1.10, 1.20, 1.05, 1.20, 1.20, 1.08, 1.15, 1.08,
};

/* ---- The hidden model's scales (see docs/synth.md) ---- */

#define HEAD_RANKS 64.0    /* ranks up to here carry full-size weights; rank k beyond, (HEAD/k)^1.5 of it */
#define SIGMA_FIRST 0.16   /* first-order weight of a categorical value (head) */
#define SIGMA_MISSING 0.25 /* weight of a missing categorical or count */
#define SIGMA_DENSE 0.20   /* step and bump heights of a count's term */
#define LATENT_DIM 8
#define SIGMA_LATENT 0.31  /* per component of a latent vector (head) */
#define TARGET_CTR 0.25
#define CALIBRATION_ROWS 32768

/* The interacting column pairs (0-based C indices): each adds <v_a, v_b>. A
 * mix of small and large columns; every column is in at least one pair, so
 * every value has a latent vector. */
static const uint8_t pairs[][2] = {
    {0, 1},   {0, 5},   {1, 8},   {2, 13}, {3, 16}, {4, 7},   {5, 10},  {6, 12},  {7, 19},  {8, 14},
    {9, 22},  {10, 17}, {11, 21}, {12, 24}, {13, 18}, {15, 25}, {16, 20}, {17, 23}, {18, 19}, {1, 6},
    {4, 13},  {14, 24},
};
#define N_PAIRS ((int)(sizeof pairs / sizeof pairs[0]))

/* ---- Zipf sampling by rejection-inversion ----
 * Hörmann and Derflinger (1996), "Rejection-inversion to generate variates
 * from monotone discrete distributions", in the form of Apache Commons RNG's
 * RejectionInversionZipfSampler: O(1) expected time and O(1) memory for any
 * cardinality, with no table of probabilities.
 *
 * The sampler draws u uniform in (H(1.5) - 1, H(n + 0.5)], where H is the
 * integral of h(x) = x^-s, takes x = H^-1(u), rounds it to the rank k, and
 * accepts k when k - x <= quick or u >= H(k + 0.5) - h(k). For the first
 * ZIPF_HEAD ranks, which take a large share of the draws, every one of those
 * steps is a comparison of u with a precomputed H value (H is increasing):
 * k is the first rank with u < H(k + 0.5), found from a guide table, and the
 * quick test is u >= H(k - quick), so k is accepted when u >= the smaller of
 * H(k - quick) and H(k + 0.5) - h(k). That skips the log() and exp() of H^-1
 * for most draws; the tail is sampled exactly as in the paper. */

#define ZIPF_HEAD 256
#define ZIPF_GUIDE 2048 /* cells of the head's u range: most hold at most one rank boundary */

typedef struct zipf {
  uint32_t n;
  uint32_t head;    /* min(n, ZIPF_HEAD) */
  double s;         /* exponent */
  double one_s;     /* 1 - s */
  double inv_one_s; /* 1 / (1 - s), or 0 when s is within 1e-6 of 1 */
  double h_x1, h_n, quick;
  double head_end;  /* H(head + 0.5): a u below it has k <= head */
  double guide_scale;
  /* Per head rank k, side by side so one cache line serves both tests:
   * upper = H(k + 0.5), accept = min(H(k - quick), H(k + 0.5) - h(k)). */
  struct {
    double upper, accept;
  } head_k[ZIPF_HEAD + 1];
  uint16_t guide[ZIPF_GUIDE];   /* the first k whose interval reaches into each cell of (h_x1, head_end) */
} zipf;

/* log1p(x)/x and expm1(x)/x, continuous at 0. */
static double helper1(double x) { return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
static double helper2(double x) { return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x)); }

static double zipf_h(const zipf *z, double x) { return exp(-z->s * log(x)); }

/* H(x) = (x^(1-s) - 1) / (1 - s); log(x) at s = 1. */
static double zipf_hint(const zipf *z, double x) {
  double lx = log(x);
  return helper2(z->one_s * lx) * lx;
}

/* The inverse of H. Away from s = 1 it is (1 + (1-s) x)^(1/(1-s)), where
 * log() instead of log1p() loses nothing that matters (the absolute error of
 * the exponent stays near 1e-15) and is several times cheaper. */
static inline double zipf_hint_inv(const zipf *z, double x) {
  double t = x * z->one_s;
  if (t < -1) t = -1; /* rounding can push it past the bound */
  if (z->inv_one_s != 0) {
    double y = 1 + t;
    return y > 0 ? exp(log(y) * z->inv_one_s) : (z->inv_one_s < 0 ? INFINITY : 0.0);
  }
  return exp(helper1(t) * x);
}

static void zipf_init(zipf *z, uint32_t n, double s) {
  memset(z, 0, sizeof *z);
  z->n = n;
  z->head = n < ZIPF_HEAD ? n : ZIPF_HEAD;
  z->s = s;
  z->one_s = 1 - s;
  z->inv_one_s = fabs(1 - s) > 1e-6 ? 1 / (1 - s) : 0;
  z->h_x1 = zipf_hint(z, 1.5) - 1;
  z->h_n = zipf_hint(z, n + 0.5);
  z->quick = 2 - zipf_hint_inv(z, zipf_hint(z, 2.5) - zipf_h(z, 2));
  for (uint32_t k = 1; k <= z->head; k++) {
    z->head_k[k].upper = zipf_hint(z, k + 0.5);
    z->head_k[k].accept = fmin(zipf_hint(z, k - z->quick), z->head_k[k].upper - zipf_h(z, k));
  }
  z->head_end = z->head_k[z->head].upper;
  z->guide_scale = ZIPF_GUIDE / (z->head_end - z->h_x1);
  uint32_t k = 1;
  for (int i = 0; i < ZIPF_GUIDE; i++) {
    double cell_start = z->h_x1 + i / z->guide_scale;
    while (k < z->head && z->head_k[k].upper <= cell_start) k++;
    z->guide[i] = (uint16_t)k;
  }
}

/* A rank in [1, n]. */
static inline uint32_t zipf_sample(const zipf *z, dlrec_rng *r) {
  for (;;) {
    double u = z->h_n + next_uniform(r) * (z->h_x1 - z->h_n);
    uint32_t k;
    if (u < z->head_end) {
      int cell = (int)((u - z->h_x1) * z->guide_scale);
      k = z->guide[cell < 0 ? 0 : cell >= ZIPF_GUIDE ? ZIPF_GUIDE - 1 : cell];
      while (u >= z->head_k[k].upper) k++;
      if (u >= z->head_k[k].accept) return k;
      continue;
    }
    double x = zipf_hint_inv(z, u);
    double kd = x + 0.5;
    k = kd < 1 ? 1 : kd >= (double)z->n ? z->n : (uint32_t)kd;
    if (k - x <= z->quick) return k;
    double bound = zipf_hint(z, k + 0.5) - zipf_h(z, k);
    if (u >= bound) return k;
  }
}

/* ---- Counts: a discretized normal over octaves, sampled by an alias table ---- */

#define OCTAVES 32 /* octave k holds [2^k - 1, 2^(k+1) - 1); k <= 30 keeps values below 2^31 */

typedef struct octaves {
  uint32_t prob[OCTAVES]; /* alias method (Walker): keep index i if u32 < prob[i] */
  uint8_t alias[OCTAVES];
} octaves;

static double normal_cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

static void octaves_init(octaves *o, double mu, double sd) {
  double p[OCTAVES];
  for (int k = 0; k < OCTAVES; k++) {
    double lo = k == 0 ? -INFINITY : (k - mu) / sd;
    double hi = k >= 30 ? INFINITY : (k + 1 - mu) / sd;
    p[k] = k > 30 ? 0 : normal_cdf(hi) - normal_cdf(lo);
  }
  /* Vose's construction: scaled probabilities split into small and large. */
  double q[OCTAVES];
  int small[OCTAVES], large[OCTAVES], ns = 0, nl = 0;
  for (int k = 0; k < OCTAVES; k++) {
    q[k] = p[k] * OCTAVES;
    if (q[k] < 1) small[ns++] = k;
    else large[nl++] = k;
  }
  for (int k = 0; k < OCTAVES; k++) o->alias[k] = (uint8_t)k;
  while (ns && nl) {
    int s = small[--ns], l = large[--nl];
    o->prob[s] = (uint32_t)fmin(q[s] * 4294967296.0, 4294967295.0);
    o->alias[s] = (uint8_t)l;
    q[l] -= 1 - q[s];
    if (q[l] < 1) small[ns++] = l;
    else large[nl++] = l;
  }
  while (nl) o->prob[large[--nl]] = UINT32_MAX;
  while (ns) o->prob[small[--ns]] = UINT32_MAX; /* rounding leftovers are ~1 */
}

/* 2^-k, exact, for k in [0, OCTAVES). */
static const double inv_pow2[OCTAVES] = {
    0x1p-0,  0x1p-1,  0x1p-2,  0x1p-3,  0x1p-4,  0x1p-5,  0x1p-6,  0x1p-7,  0x1p-8,  0x1p-9,  0x1p-10,
    0x1p-11, 0x1p-12, 0x1p-13, 0x1p-14, 0x1p-15, 0x1p-16, 0x1p-17, 0x1p-18, 0x1p-19, 0x1p-20, 0x1p-21,
    0x1p-22, 0x1p-23, 0x1p-24, 0x1p-25, 0x1p-26, 0x1p-27, 0x1p-28, 0x1p-29, 0x1p-30, 0x1p-31,
};

/* ---- The model ---- */

typedef struct dense_term {
  double step_at, step_h;           /* h * clamp(2 (L - at), -1, 1) */
  double bump_at, bump_inv_w, bump_h; /* h * max(0, 1 - |L - at| / w) */
  double missing;                   /* the term of a missing value */
} dense_term;

struct dlrec_synth_model {
  uint64_t model_seed;
  double bias;
  uint32_t card[DLREC_SYNTH_CAT];
  uint32_t miss_dense[DLREC_SYNTH_DENSE]; /* missing when the top 32 bits of a draw are below */
  uint32_t miss_cat[DLREC_SYNTH_CAT];
  uint32_t miss_group[2];
  uint32_t hex_k1[DLREC_SYNTH_CAT], hex_k2[DLREC_SYNTH_CAT]; /* the per-column string bijections */
  uint64_t key_w[DLREC_SYNTH_CAT], key_v[DLREC_SYNTH_CAT];  /* weight and latent-vector hash keys */
  double missing_w[DLREC_SYNTH_CAT];
  octaves oct[DLREC_SYNTH_DENSE];
  dense_term dense[DLREC_SYNTH_DENSE];
  zipf z[DLREC_SYNTH_CAT];
};

static const double SQRT3 = 1.7320508075688772;
/* A latent lane's unit: lanes are uniform in [-8192, 8192), variance
 * 8192^2 / 3, so this gives components of standard deviation SIGMA_LATENT. */
#define LATENT_LANE_SCALE (SIGMA_LATENT * 1.7320508075688772 / 8192.0)

/* A hash's 64 bits as an approximately standard normal number: the sum of four
 * 16-bit uniforms (Irwin-Hall), centered and scaled to unit variance. */
static double hash_normal(uint64_t h) {
  uint64_t s = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
  return ((double)s * (1.0 / 65536.0) - 2.0) * SQRT3;
}

/* A hash as a uniform number in [-1, 1). */
static double hash_signed_unit(uint64_t h) { return (double)(h >> 11) * 0x1.0p-52 - 1.0; }

static uint64_t derive_key(uint64_t model_seed, uint64_t purpose, uint64_t index) {
  return dlrec_mix64(dlrec_mix64(model_seed ^ 0xa0761d6478bd642fULL) + purpose * 0xe7037ed1a0b428dbULL +
                     index * 0x9e3779b97f4a7c15ULL);
}

/* The rank's weight scale: the Zipf head (ranks seen often enough to learn)
 * carries full weights; beyond it weights shrink as (HEAD/k)^1.5, so the rare
 * tail adds little signal that no finite sample could teach. */
static inline double rank_scale(uint32_t k) {
  if (k <= (uint32_t)HEAD_RANKS) return 1.0;
  double f = HEAD_RANKS / (double)k;
  return f * sqrt(f);
}

/* The first-order weight of rank k >= 1 of column c, before its rank scale. */
static inline double first_order(const dlrec_synth_model *m, int c, uint32_t k) {
  return SIGMA_FIRST * hash_normal(dlrec_mix64(m->key_w[c] + k * 0x9e3779b97f4a7c15ULL));
}

/* Latent vectors are GCC/clang vector types: eight 16-bit lanes made from
 * two hashes, then eight floats. Pair products accumulate lane-wise in one
 * vector, summed once a row, so an interaction costs one vector multiply-add
 * instead of a horizontal sum per pair. */
typedef uint64_t latent_bits __attribute__((vector_size(16)));
typedef int16_t latent_i16 __attribute__((vector_size(16)));
typedef float latent_vec __attribute__((vector_size(32)));

/* The latent vector of rank k >= 1 of column c, times `scale` (the rank's
 * scale): the bits of two hashes, each 16-bit lane read as a 14-bit number
 * uniform in [-8192, 8192), in units of LATENT_LANE_SCALE. (Returned through
 * a pointer: a 32-byte vector returned by value has an ABI that depends on
 * AVX being enabled, which compilers warn about.) */
static inline void latent(const dlrec_synth_model *m, int c, uint32_t k, double scale, latent_vec *out) {
  uint64_t h0 = dlrec_mix64(m->key_v[c] + k * 0x9e3779b97f4a7c15ULL);
  uint64_t h1 = dlrec_mix64(h0 ^ 0xd6e8feb86659fd93ULL);
  latent_bits bits = {h0, h1};
  latent_bits lanes14 = (bits >> 2) & 0x3fff3fff3fff3fffull; /* each lane's top 14 bits */
  latent_i16 lanes = (latent_i16)lanes14 - 8192;
  *out = __builtin_convertvector(lanes, latent_vec) * (float)(scale * LATENT_LANE_SCALE);
}

/* Written with min/max selects rather than branches: the branches would be
 * unpredictable, and this runs thirteen times a row. */
static inline double dense_value_term(const dense_term *t, double l) {
  double step = 2.0 * (l - t->step_at);
  step = step < -1.0 ? -1.0 : step;
  step = step > 1.0 ? 1.0 : step;
  double bump = 1.0 - fabs(l - t->bump_at) * t->bump_inv_w;
  bump = bump > 0.0 ? bump : 0.0;
  return t->step_h * step + t->bump_h * bump;
}

/* A 32-bit bijection keyed per column: every step (xor or add of a constant,
 * multiplication by an odd number, xor-shift right) is invertible, so
 * distinct ranks give distinct strings, and hex order says nothing about
 * frequency. */
static inline uint32_t hex_bijection(uint32_t x, uint32_t k1, uint32_t k2) {
  x ^= k1;
  x *= 0x9e3779b1u;
  x ^= x >> 15;
  x += k2;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

static inline uint32_t threshold32(double p) {
  return p <= 0 ? 0 : p >= 1 ? UINT32_MAX : (uint32_t)(p * 4294967296.0);
}

uint32_t dlrec_synth_criteo_cardinality(int col) {
  return col >= 0 && col < DLREC_SYNTH_CAT ? criteo_cardinality[col] : 0;
}

double dlrec_synth_zipf_exponent(int col) { return col >= 0 && col < DLREC_SYNTH_CAT ? cat_zipf_s[col] : 0.0; }

uint32_t dlrec_synth_cardinality(const dlrec_synth_model *m, int col) {
  return col >= 0 && col < DLREC_SYNTH_CAT ? m->card[col] : 0;
}

double dlrec_synth_bias(const dlrec_synth_model *m) { return m->bias; }

/* ---- One row ---- */

static const char digit_pairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* Writes x (> -2^31, < 2^31) in decimal; returns the end. The digit count is
 * found first, so the digits go straight to their place, two at a time. */
static inline char *put_int(char *p, int64_t x) {
  if (x < 0) {
    *p++ = '-';
    x = -x;
  }
  uint32_t v = (uint32_t)x;
  int n = v < 10 ? 1 : v < 100 ? 2 : v < 1000 ? 3 : v < 10000 ? 4 : v < 100000 ? 5 : v < 1000000 ? 6
        : v < 10000000 ? 7 : v < 100000000 ? 8 : v < 1000000000 ? 9 : 10;
  char *e = p + n, *b = e;
  while (v >= 100) {
    unsigned d = (v % 100) * 2;
    v /= 100;
    *--b = digit_pairs[d + 1];
    *--b = digit_pairs[d];
  }
  if (v >= 10) {
    *--b = digit_pairs[v * 2 + 1];
    *--b = digit_pairs[v * 2];
  } else {
    *--b = (char)('0' + v);
  }
  return e;
}

/* Writes x as 8 lowercase hex digits. The nibbles are spread one per byte
 * (SWAR), turned into ASCII all at once, and stored with one 8-byte write. */
static inline char *put_hex8(char *p, uint32_t x) {
  uint64_t v = x;
  v = ((v & 0xffff0000ull) << 16) | (v & 0xffffull);
  v = ((v & 0x0000ff000000ff00ull) << 8) | (v & 0x000000ff000000ffull);
  v = ((v & 0x00f000f000f000f0ull) << 4) | (v & 0x000f000f000f000full);
  /* Byte i now holds nibble i. Bytes of 10..15 get 'a' - '0' - 10 more. */
  uint64_t letters = ((v + 0x0606060606060606ull) >> 4) & 0x0101010101010101ull;
  v += 0x3030303030303030ull + letters * (uint64_t)('a' - '0' - 10);
  v = __builtin_bswap64(v); /* the most significant nibble first */
  memcpy(p, &v, 8);
  return p + 8;
}

/* What one row's draw gives besides its text. */
typedef struct row_result {
  double logit_first; /* without interactions, bias included */
  double logit;
} row_result;

/* Draws one row; writes its fields after the label (from "\t" of I1 through
 * the newline) at text when text is not NULL, and returns the end. */
static char *draw_row(const dlrec_synth_model *m, dlrec_rng *r, char *text, uint32_t *rank, row_result *res) {
  double lin = m->bias;
  char *p = text;

  for (int j = 0; j < DLREC_SYNTH_DENSE; j++) {
    uint64_t u = next_u64(r);
    if (p) *p++ = '\t';
    if ((uint32_t)(u >> 32) < m->miss_dense[j]) {
      lin += m->dense[j].missing;
      continue;
    }
    /* The low 32 bits choose the octave: 5 bits of index, 27 of threshold. */
    uint32_t idx = (uint32_t)u & (OCTAVES - 1);
    uint32_t k = ((uint32_t)u & ~(uint32_t)(OCTAVES - 1)) < (m->oct[j].prob[idx] & ~(uint32_t)(OCTAVES - 1))
                     ? idx
                     : m->oct[j].alias[idx];
    /* x = 2^k - 1 + m, m uniform in [0, 2^k) from the top k bits of v, and
     * L = log2(1 + x) linear between powers of two = k + m / 2^k. */
    uint64_t v = next_u64(r);
    uint64_t mant = k == 0 ? 0 : v >> (64 - k);
    int64_t x = (int64_t)(((uint64_t)1 << k) - 1 + mant);
    double l = (double)k + (double)mant * inv_pow2[k];
    if (j == 1) {
      /* I2's negatives, from the low 32 bits (the mantissa took at most the top 30); L = -1. */
      uint32_t w = (uint32_t)v;
      if (w < threshold32(I2_NEG_3 + I2_NEG_2 + I2_NEG_1)) {
        x = w < threshold32(I2_NEG_3) ? -3 : w < threshold32(I2_NEG_3 + I2_NEG_2) ? -2 : -1;
        l = -1.0;
      }
    }
    lin += dense_value_term(&m->dense[j], l);
    if (p) p = put_int(p, x);
  }

  uint64_t g = next_u64(r);
  int group_missing_now[2] = {(uint32_t)(g >> 32) < m->miss_group[0], (uint32_t)g < m->miss_group[1]};
  latent_vec v[DLREC_SYNTH_CAT];
  /* Ranks first, in a tight loop of their own: the samples are independent,
   * so the processor overlaps one's log() and exp() with the next one's. */
  uint32_t k_of[DLREC_SYNTH_CAT];
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) {
    int missing;
    if (cat_missing_group[c] >= 0) missing = group_missing_now[cat_missing_group[c]];
    else missing = m->miss_cat[c] && (uint32_t)(next_u64(r) >> 32) < m->miss_cat[c];
    k_of[c] = missing ? 0 : zipf_sample(&m->z[c], r);
  }
  if (rank) memcpy(rank, k_of, sizeof k_of);
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) {
    uint32_t k = k_of[c];
    if (k == 0) {
      /* A missing value has a first-order weight but no latent vector. */
      lin += m->missing_w[c];
      v[c] = (latent_vec){0};
      if (p) *p++ = '\t';
      continue;
    }
    double scale = rank_scale(k);
    lin += scale * first_order(m, c, k);
    latent(m, c, k, scale, &v[c]);
    if (p) {
      *p++ = '\t';
      p = put_hex8(p, hex_bijection(k, m->hex_k1[c], m->hex_k2[c]));
    }
  }
  if (p) *p++ = '\n';

  latent_vec acc = {0};
  for (int i = 0; i < N_PAIRS; i++) acc += v[pairs[i][0]] * v[pairs[i][1]];
  double inter = 0;
  for (int j = 0; j < LATENT_DIM; j++) inter += acc[j];
  res->logit_first = lin;
  res->logit = lin + inter;
  return p;
}

static inline double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

/* "%.6f" of p in [0, 1], by hand; returns the end. */
static char *put_prob(char *p, double prob) {
  uint32_t q = (uint32_t)(prob * 1e6 + 0.5);
  if (q >= 1000000) {
    memcpy(p, "1.000000\n", DLREC_SYNTH_PROB_BYTES);
    return p + DLREC_SYNTH_PROB_BYTES;
  }
  p[0] = '0';
  p[1] = '.';
  for (int i = 7; i >= 2; i--) {
    p[i] = (char)('0' + q % 10);
    q /= 10;
  }
  p[8] = '\n';
  return p + DLREC_SYNTH_PROB_BYTES;
}

dlrec_status dlrec_synth_generate(const dlrec_synth_model *m, uint64_t seed, uint64_t chunk, uint32_t rows,
                                  dlrec_synth_rows *out) {
  if (out->text && out->text_cap / DLREC_SYNTH_MAX_ROW_BYTES < rows)
    return dlrec_error(DLREC_ERR_INVALID, "dlrec_synth_generate: a text buffer of %zu bytes is too small for %u rows",
                       out->text_cap, rows);
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, chunk);
  char *p = out->text, *q = out->prob_text;
  uint64_t positives = 0;
  for (uint32_t i = 0; i < rows; i++) {
    row_result res;
    char *row = p;
    if (p) p += 1; /* the label goes first but is known last */
    p = draw_row(m, &r, p, out->rank ? out->rank + (size_t)i * DLREC_SYNTH_CAT : NULL, &res);
    double prob = sigmoid(res.logit);
    int label = next_uniform(&r) < prob;
    positives += (uint64_t)label;
    if (row) row[0] = (char)('0' + label);
    if (out->prob) out->prob[i] = prob;
    if (q) q = put_prob(q, prob);
    if (out->logit_first) out->logit_first[i] = res.logit_first;
    if (out->label) out->label[i] = (uint8_t)label;
  }
  out->text_bytes = p ? (size_t)(p - out->text) : 0;
  out->prob_text_bytes = q ? (size_t)(q - out->prob_text) : 0;
  out->positives = positives;
  return DLREC_OK;
}

/* ---- Making a model ---- */

/* Sets the bias so that the mean click probability over a fixed sample of
 * rows is TARGET_CTR (Newton's method on the mean of sigmoid(b + z)). */
static void calibrate(dlrec_synth_model *m, double *z) {
  dlrec_rng r;
  dlrec_rng_seed(&r, m->model_seed ^ 0x5851f42d4c957f2dULL, UINT64_MAX);
  m->bias = 0;
  for (int i = 0; i < CALIBRATION_ROWS; i++) {
    row_result res;
    draw_row(m, &r, NULL, NULL, &res);
    z[i] = res.logit;
  }
  double b = log(TARGET_CTR / (1 - TARGET_CTR));
  for (int it = 0; it < 50; it++) {
    double f = 0, df = 0;
    for (int i = 0; i < CALIBRATION_ROWS; i++) {
      double p = sigmoid(b + z[i]);
      f += p;
      df += p * (1 - p);
    }
    f = f / CALIBRATION_ROWS - TARGET_CTR;
    df /= CALIBRATION_ROWS;
    double step = f / df;
    b -= step;
    if (fabs(step) < 1e-9) break;
  }
  m->bias = b;
}

const uint32_t *dlrec_synth_cardinality_preset(const char *name) {
  if (name && !strcmp(name, "criteo-kaggle")) return criteo_cardinality;
  if (name && !strcmp(name, "criteo-1tb")) return criteo_1tb_cardinality;
  return NULL;
}

dlrec_status dlrec_synth_model_new(uint64_t model_seed, const uint32_t *cardinalities, uint64_t max_cardinality,
                                   dlrec_synth_model **out) {
  *out = NULL;
  if (!cardinalities) cardinalities = criteo_cardinality;
  for (int c = 0; c < DLREC_SYNTH_CAT; c++)
    if (!cardinalities[c]) return dlrec_error(DLREC_ERR_INVALID, "column C%d: a cardinality of 0", c + 1);
  dlrec_synth_model *m = calloc(1, sizeof *m);
  double *z = malloc(CALIBRATION_ROWS * sizeof *z);
  if (!m || !z) {
    free(m);
    free(z);
    return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  m->model_seed = model_seed;
  for (int j = 0; j < DLREC_SYNTH_DENSE; j++) {
    m->miss_dense[j] = threshold32(dense_missing[j]);
    octaves_init(&m->oct[j], dense_mu[j], dense_sd[j]);
    /* The step sits near the column's median, the bump somewhere within one
     * standard deviation of it: where the data is, so both can be learned. */
    dense_term *t = &m->dense[j];
    t->step_at = dense_mu[j] + 0.5 * dense_sd[j] * hash_signed_unit(derive_key(model_seed, 1, (uint64_t)j));
    t->step_h = SIGMA_DENSE * hash_normal(derive_key(model_seed, 2, (uint64_t)j));
    t->bump_at = dense_mu[j] + dense_sd[j] * hash_signed_unit(derive_key(model_seed, 3, (uint64_t)j));
    t->bump_inv_w = 1 / (0.5 + 0.5 * dense_sd[j]);
    t->bump_h = SIGMA_DENSE * hash_normal(derive_key(model_seed, 4, (uint64_t)j));
    t->missing = dense_missing[j] > 0 ? SIGMA_MISSING * hash_normal(derive_key(model_seed, 5, (uint64_t)j)) : 0;
  }
  for (int g = 0; g < 2; g++) m->miss_group[g] = threshold32(group_missing[g]);
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) {
    uint32_t n = cardinalities[c];
    if (max_cardinality && max_cardinality < n) n = (uint32_t)max_cardinality;
    m->card[c] = n;
    m->miss_cat[c] = cat_missing_group[c] >= 0 ? 0 : threshold32(cat_missing[c]);
    uint64_t hk = derive_key(model_seed, 10, (uint64_t)c);
    m->hex_k1[c] = (uint32_t)hk;
    m->hex_k2[c] = (uint32_t)(hk >> 32);
    m->key_w[c] = derive_key(model_seed, 11, (uint64_t)c);
    m->key_v[c] = derive_key(model_seed, 12, (uint64_t)c);
    m->missing_w[c] = cat_missing[c] > 0 ? SIGMA_MISSING * hash_normal(derive_key(model_seed, 13, (uint64_t)c)) : 0;
    zipf_init(&m->z[c], n, cat_zipf_s[c]);
  }
  calibrate(m, z);
  free(z);
  *out = m;
  return DLREC_OK;
}

void dlrec_synth_model_free(dlrec_synth_model *m) { free(m); }
