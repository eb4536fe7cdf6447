/* The CUDA backend's GEMMs: the linear layers on cuBLASLt in fp32, tf32,
 * bf16 or fp16 (16-bit operands converted, padded and, while keeping,
 * kept), DCN-v2's cross layers and mixture built on them, and the packed
 * layers of batch-invariant scoring. */
#include "backend/cuda/cuda_impl.h"

#include <stdlib.h>

#include "backend/checks.h"

/* ---- linear layers: cuBLASLt, fp32, bf16 or fp16 operands ---- */

/* Row-major (r, c) is cuBLASLt's column-major (c, r): out (B, OUT) is
 * computed as outᵀ (OUT, B) = W (stored (OUT, IN), read transposed) · inᵀ. */

static cuda_blas_type gemm_type(const dlrec_backend *be) {
  return be->precision == DLREC_PRECISION_BF16   ? CUDA_BLAS_BF16
         : be->precision == DLREC_PRECISION_FP16 ? CUDA_BLAS_FP16
         : be->precision == DLREC_PRECISION_TF32 ? CUDA_BLAS_TF32
                                                 : CUDA_BLAS_FP32;
}

/* The operands a GEMM reads: the fp32 arrays themselves, or (bf16, fp16)
 * their rounded copies in scratch, and the scratch the GEMM writes. */
typedef struct operands {
  const void *a[3];
  float *partial;     /* the bias gradient's chunk sums */
  float *out;         /* a result of rows pad(IN) wide (gemm_backward) */
  const float *mask;  /* set by the caller: a[0] is converted through this ReLU mask, its sums into partial */
} operands;

/* Whether the GEMMs read 16-bit copies of their operands. */
static int half_operands(const dlrec_backend *be) {
  return gemm_type(be) == CUDA_BLAS_BF16 || gemm_type(be) == CUDA_BLAS_FP16;
}

/* 16-bit operands whose rows are not a multiple of 16 bytes leave cuBLASLt
 * only its slow unaligned kernels (DLRM's 479-wide interaction ran 5x slower
 * in them): the rows of IN values a bf16 or fp16 GEMM reads are made
 * pad(IN) wide, the pad zero, and the fp32 results IN wide are made pad(IN)
 * wide in scratch and copied out. */
static int pad_in(const dlrec_backend *be, int IN) { return half_operands(be) ? (IN + 7) / 8 * 8 : IN; }

int cuda_keep_operands(dlrec_backend *be, int on) {
  cuda_ctx *x = ctx_of(be);
  if (!half_operands(be)) return 0;
  x->keep = on;
  for (uint32_t i = 0; i < x->n_kept; i++) x->kept[i].src = NULL;
  x->n_kept = 0;
  return 1;
}

int cuda_fresh_gradients(dlrec_backend *be, int on) {
  fresh_grads_set(&ctx_of(be)->fresh, on);
  return 1;
}

/* The kept copy of src (rows x width, in rows of ld), or NULL. */
static const uint16_t *kept_find(const cuda_ctx *x, const float *src, size_t rows, size_t width, size_t ld) {
  for (uint32_t i = 0; i < x->n_kept; i++) {
    const struct cuda_kept *k = &x->kept[i];
    if (k->src == src && k->rows == rows && k->width == width && k->ld == ld) return k->h;
  }
  return NULL;
}

/* Where a forward converts src while keeping: its slot (the one of the same
 * source and shape, or the next one, grown as needed); NULL when not
 * keeping, out of slots or out of memory (then scratch will do). */
static uint16_t *kept_slot(cuda_ctx *x, const float *src, size_t rows, size_t width, size_t ld) {
  if (!x->keep) return NULL;
  uint16_t *h = (uint16_t *)kept_find(x, src, rows, width, ld);
  if (h || x->n_kept == MAX_KEPT) return h;
  struct cuda_kept *k = &x->kept[x->n_kept];
  const size_t bytes = rows * ld * 2;
  if (k->cap < bytes) {
    if (k->h) cudaFree(k->h); /* waits for the ops queued before: the last pass's readers */
    k->h = NULL;
    k->cap = 0;
    if (cudaMalloc((void **)&k->h, bytes) != cudaSuccess) {
      (void)cudaGetLastError(); /* out of memory is not sticky: this operand goes through scratch */
      k->h = NULL;
      return NULL;
    }
    k->cap = bytes;
  }
  *k = (struct cuda_kept){src, rows, width, ld, k->h, k->cap};
  x->n_kept++;
  return k->h;
}

/* How prepare treats an operand while keeping: as a forward's input or
 * weights (converted into its kept slot), as a backward's (its kept copy
 * read when there is one), or neither (dout: converted every time). */
enum { KEEP_NONE, KEEP_STORE, KEEP_READ };

/* Converts (bf16, fp16) or passes on the count operands src[i], rows[i] of
 * width[i] floats (rows of ld[i] in the copies), and carves partial_floats
 * and out_floats of scratch; keep[i] says what keeping does with src[i]. */
static dlrec_status prepare(dlrec_backend *be, operands *o, const float *const *src, const size_t *rows,
                            const size_t *width, const size_t *ld, const int *keep, int count,
                            size_t partial_floats, size_t out_floats, const char *what) {
  cuda_ctx *x = ctx_of(be);
  const int half = half_operands(be), fp16 = gemm_type(be) == CUDA_BLAS_FP16;
  const uint16_t *found[3] = {NULL, NULL, NULL};
  size_t bytes = (partial_floats + out_floats) * sizeof(float) + 512;
  for (int i = 0; half && i < count; i++) {
    if (src[i] && keep[i] == KEEP_READ) found[i] = kept_find(x, src[i], rows[i], width[i], ld[i]);
    if (!found[i]) bytes += (rows[i] * ld[i] * 2 + 255) / 256 * 256;
  }
  char *at = cuda_scratch(be, bytes);
  if (!at) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for %zu bytes of scratch", what, bytes);
  o->partial = partial_floats ? cuda_carve(&at, partial_floats * sizeof(float)) : NULL;
  o->out = out_floats ? cuda_carve(&at, out_floats * sizeof(float)) : NULL;
  for (int i = 0; i < count; i++) {
    if (!half || !src[i] || found[i]) {
      o->a[i] = found[i] ? (const void *)found[i] : (const void *)src[i];
      continue;
    }
    uint16_t *h = keep[i] == KEEP_STORE ? kept_slot(x, src[i], rows[i], width[i], ld[i]) : NULL;
    if (!h) h = cuda_carve(&at, rows[i] * ld[i] * 2);
    if (i == 0 && o->mask && ld[0] == width[0])
      TRY(cuda_status(cuk_relu_to_half_chunks(x->stream, h, o->partial, src[0], o->mask, rows[0], width[0], fp16),
                      what));
    else if (i == 0 && o->mask)
      return dlrec_error(DLREC_ERR_INTERNAL, "%s: a masked operand must be unpadded", what);
    else
      TRY(cuda_status(cuk_to_half(x->stream, h, ld[i], src[i], rows[i], width[i], fp16), what));
    o->a[i] = h;
  }
  return DLREC_OK;
}

static dlrec_status gemm_forward(dlrec_backend *be, float *out, const float *in, const float *weight,
                                 const float *bias, int B, int IN, int OUT, int relu) {
  enter(be);
  operands o = {0};
  const size_t P = (size_t)pad_in(be, IN);
  TRY(prepare(be, &o, (const float *[]){in, weight}, (size_t[]){(size_t)B, (size_t)OUT},
              (size_t[]){(size_t)IN, (size_t)IN}, (size_t[]){P, P}, (const int[]){KEEP_STORE, KEEP_STORE}, 2, 0, 0,
              "linear_forward"));
  return cuda_blas_matmul(ctx_of(be)->blas, out, o.a[1], (int)P, 1, o.a[0], (int)P, 0, OUT, B, (int)P, gemm_type(be),
                          0.0f, bias, relu);
}

/* mask: the ReLU's (linear_relu_backward) where the operands are 16-bit,
 * folded into dout's conversion and the bias sums; NULL otherwise. */
static dlrec_status gemm_backward(dlrec_backend *be, float *din, float *dweight, float *dbias, const float *dout,
                                  const float *mask, const float *in, const float *weight, int B, int IN, int OUT) {
  cudaStream_t st = enter(be);
  operands o = {.mask = mask};
  const int P = pad_in(be, IN);
  const size_t out_floats = P == IN ? 0 : (size_t)P * ((size_t)OUT > (size_t)B ? (size_t)OUT : (size_t)B);
  TRY(prepare(be, &o, (const float *[]){dout, in, din ? weight : NULL}, (size_t[]){(size_t)B, (size_t)B, (size_t)OUT},
              (size_t[]){(size_t)OUT, (size_t)IN, (size_t)IN}, (size_t[]){(size_t)OUT, (size_t)P, (size_t)P},
              (const int[]){KEEP_NONE, KEEP_READ, KEEP_READ}, 3,
              dbias ? cuk_colsum_partials((size_t)B, (size_t)OUT) : 0, out_floats, "linear_backward"));
  cuda_blas *blas = ctx_of(be)->blas;
  /* dWᵀ (IN, OUT) += inᵀ (IN, B) · dout (B, OUT), through rows of P; = where fresh */
  const int add = fresh_grads_accumulates(&ctx_of(be)->fresh, dweight, (size_t)OUT * IN);
  float *dw = P == IN ? dweight : o.out;
  if (P != IN && add) TRY(cuda_status(cuk_copy_rows(st, dw, P, dweight, IN, OUT, IN), "linear_backward"));
  TRY(cuda_blas_matmul(blas, dw, o.a[1], P, 0, o.a[0], OUT, 1, P, OUT, B, gemm_type(be), add ? 1.0f : 0.0f, NULL,
                       0));
  if (P != IN) TRY(cuda_status(cuk_copy_rows(st, dweight, IN, dw, P, OUT, IN), "linear_backward"));
  if (dbias && mask) TRY(cuda_status(cuk_colsum_finish(st, dbias, o.partial, (size_t)B, (size_t)OUT), "bias gradient"));
  else if (dbias)
    TRY(cuda_status(cuk_colsum_accumulate(st, dbias, dout, (size_t)B, (size_t)OUT, o.partial), "bias gradient"));
  /* dinᵀ (IN, B) = W (IN, OUT as stored) · doutᵀ (OUT, B), through rows of P */
  if (!din) return DLREC_OK;
  float *di = P == IN ? din : o.out;
  TRY(cuda_blas_matmul(blas, di, o.a[2], P, 0, o.a[0], OUT, 0, P, B, OUT, gemm_type(be), 0.0f, NULL, 0));
  return P == IN ? DLREC_OK : cuda_status(cuk_copy_rows(st, din, IN, di, P, B, IN), "linear_backward");
}

dlrec_status cuda_linear_forward(dlrec_backend *be, float *out, const float *in, const float *weight,
                                 const float *bias, int B, int IN, int OUT, dlrec_act act) {
  TRY(nn_check_linear("linear_forward", out, in, weight, B, IN, OUT));
  return gemm_forward(be, out, in, weight, bias, B, IN, OUT, act == DLREC_ACT_RELU);
}

dlrec_status cuda_linear_backward(dlrec_backend *be, float *din, float *dweight, float *dbias,
                                  const float *dout, const float *in, const float *weight, int B, int IN,
                                  int OUT) {
  TRY(nn_check_linear("linear_backward", dweight, dout, in, B, IN, OUT));
  if (din && !weight) return dlrec_error(DLREC_ERR_INVALID, "linear_backward: din needs the weights");
  return gemm_backward(be, din, dweight, dbias, dout, NULL, in, weight, B, IN, OUT);
}

/* With 16-bit operands the mask rides on dout's conversion and the bias's
 * chunk sums (cuk_relu_to_half_chunks), dout untouched; in fp32 and tf32
 * the ReLU's backward runs in place, then the linear backward. */
dlrec_status cuda_linear_relu_backward(dlrec_backend *be, float *din, float *dweight, float *dbias, float *dout,
                                       const float *out, const float *in, const float *weight, int B, int IN,
                                       int OUT) {
  TRY(nn_check_linear("linear_relu_backward", dweight, dout, in, B, IN, OUT));
  TRY(NN_NONNULL("linear_relu_backward", out));
  if (din && !weight) return dlrec_error(DLREC_ERR_INVALID, "linear_relu_backward: din needs the weights");
  if (half_operands(be)) return gemm_backward(be, din, dweight, dbias, dout, out, in, weight, B, IN, OUT);
  TRY(cuda_status(cuk_relu_backward(enter(be), dout, dout, out, (size_t)B * OUT), "linear_relu_backward"));
  return gemm_backward(be, din, dweight, dbias, dout, NULL, in, weight, B, IN, OUT);
}

/* ---- DCN-v2's cross layers: the products on cuBLASLt, the gate a kernel
 * (the composition of src/backend/cpu/cross.c) ---- */

dlrec_status cuda_cross_forward(dlrec_backend *be, float *out, float *act, const float *x0, const float *xl,
                                const float *w, const float *bias, int B, int d) {
  TRY(NN_NONNULL("cross_forward", out, act, x0, xl, w, bias));
  TRY(nn_check_cross("cross_forward", B, d, 0));
  TRY(gemm_forward(be, act, xl, w, bias, B, d, d, 0)); /* u (B, d) */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, act, xl, (size_t)B * d), "cross_forward");
}

dlrec_status cuda_cross_backward(dlrec_backend *be, float *dx0, float *dxl, float *dw, float *dbias,
                                 const float *dout, const float *x0, const float *xl, const float *act,
                                 const float *w, float *ws, int B, int d) {
  TRY(NN_NONNULL("cross_backward", dx0, dxl, dw, dbias, dout, x0, xl, act, w, ws));
  TRY(nn_check_cross("cross_backward", B, d, 0));
  const size_t n = (size_t)B * d;
  float *du = ws; /* (B, d) */
  TRY(cuda_status(cuk_cross_gate_backward(enter(be), du, dx0, dout, x0, act, n), "cross_backward"));
  TRY(gemm_backward(be, dxl, dw, dbias, du, NULL, xl, w, B, d, d));
  return cuda_status(cuk_add(enter(be), dxl, dout, n), "cross_backward");
}

dlrec_status cuda_cross_lowrank_forward(dlrec_backend *be, float *out, float *act, const float *x0,
                                        const float *xl, const float *v, const float *u, const float *bias,
                                        int B, int d, int r) {
  TRY(NN_NONNULL("cross_lowrank_forward", out, act, x0, xl, v, u, bias));
  TRY(nn_check_cross_lowrank("cross_lowrank_forward", B, d, r));
  float *t = act, *uu = act + (size_t)B * r;
  TRY(gemm_forward(be, t, xl, v, NULL, B, d, r, 0));   /* t (B, r) = xl · Vᵀ */
  TRY(gemm_forward(be, uu, t, u, bias, B, r, d, 0));   /* u (B, d) = t · Uᵀ + bias */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, uu, xl, (size_t)B * d), "cross_lowrank_forward");
}

dlrec_status cuda_cross_lowrank_backward(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *du,
                                         float *dbias, const float *dout, const float *x0, const float *xl,
                                         const float *act, const float *v, const float *u, float *ws, int B,
                                         int d, int r) {
  TRY(NN_NONNULL("cross_lowrank_backward", dx0, dxl, dv, du, dbias, dout, x0, xl, act, v, u, ws));
  TRY(nn_check_cross_lowrank("cross_lowrank_backward", B, d, r));
  const size_t n = (size_t)B * d;
  const float *t = act, *uu = act + (size_t)B * r;
  float *dpre = ws, *dt = ws + n; /* (B, d), (B, r) */
  TRY(cuda_status(cuk_cross_gate_backward(enter(be), dpre, dx0, dout, x0, uu, n), "cross_lowrank_backward"));
  TRY(gemm_backward(be, dt, du, dbias, dpre, NULL, t, u, B, r, d));
  TRY(gemm_backward(be, dxl, dv, NULL, dt, NULL, xl, v, B, d, r));
  return cuda_status(cuk_add(enter(be), dxl, dout, n), "cross_lowrank_backward");
}

/* ---- the mixture of low-rank experts (src/backend/cpu/cross_mix.c's composition) ---- */

dlrec_status cuda_cross_mix_forward(dlrec_backend *be, float *out, float *act, const float *x0,
                                    const float *xl, const float *v, const float *c, const float *u,
                                    const float *gate, const float *bias, int B, int d, int r, int K) {
  const char *what = "cross_mix_forward";
  TRY(NN_NONNULL(what, out, act, x0, xl, v, c, u, gate, bias));
  TRY(nn_check_cross_mix(what, B, d, r, K));
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  float *t1 = act, *t2 = t1 + K * Br, *e = t2 + K * Br, *p = e + K * Bd;
  for (int k = 0; k < K; k++) {
    TRY(gemm_forward(be, t1 + k * Br, xl, v + (size_t)k * r * d, NULL, B, d, r, 1));
    TRY(gemm_forward(be, t2 + k * Br, t1 + k * Br, c + (size_t)k * r * r, NULL, B, r, r, 1));
    TRY(gemm_forward(be, e + k * Bd, t2 + k * Br, u + (size_t)k * d * r, bias, B, r, d, 0));
  }
  TRY(gemm_forward(be, p, xl, gate, NULL, B, d, K, 0)); /* logits (B, K) */
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_softmax_rows(st, p, B, K), what));
  TRY(cuda_status(cuk_mixture(st, out, p, e, B, d, K), what));
  return cuda_status(cuk_cross_gate(st, out, x0, out, xl, Bd), what);
}

dlrec_status cuda_cross_mix_backward(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *dc, float *du,
                                     float *dgate, float *dbias, const float *dout, const float *x0,
                                     const float *xl, const float *act, const float *v, const float *c,
                                     const float *u, const float *gate, float *ws, int B, int d, int r,
                                     int K) {
  const char *what = "cross_mix_backward";
  TRY(NN_NONNULL(what, dx0, dxl, dv, dc, du, dgate, dbias, dout, x0, xl, act, v, c, u, gate, ws));
  TRY(nn_check_cross_mix(what, B, d, r, K));
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  const float *t1 = act, *t2 = t1 + K * Br, *e = t2 + K * Br, *p = e + K * Bd;
  float *m = ws, *de = m + Bd, *tmp = de + Bd, *dt2 = tmp + Bd, *dt1 = dt2 + Br, *dlogit = dt1 + Br;
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_mixture(st, m, p, e, B, d, K), what));
  TRY(cuda_status(cuk_mix_dx0(st, dx0, m, dout, x0, Bd), what)); /* m is dm from here */
  TRY(cuda_status(cuk_mix_dlogit(st, dlogit, m, e, p, B, d, K), what));
  TRY(gemm_backward(be, tmp, dgate, NULL, dlogit, NULL, xl, gate, B, d, K));
  TRY(cuda_status(cuk_copy_rows(st, dxl, Bd, dout, Bd, 1, Bd), what));
  TRY(cuda_status(cuk_add(st, dxl, tmp, Bd), what)); /* dxl = dout + the gate's term */
  for (int k = 0; k < K; k++) {
    const float *t1k = t1 + k * Br, *t2k = t2 + k * Br;
    TRY(cuda_status(cuk_mix_scale(st, de, m, p, B, d, K, k), what));
    TRY(gemm_backward(be, dt2, du + (size_t)k * d * r, dbias, de, NULL, t2k, u + (size_t)k * d * r, B, r, d));
    TRY(cuda_status(cuk_relu_backward(st, dt2, dt2, t2k, Br), what));
    TRY(gemm_backward(be, dt1, dc + (size_t)k * r * r, NULL, dt2, NULL, t1k, c + (size_t)k * r * r, B, r, r));
    TRY(cuda_status(cuk_relu_backward(st, dt1, dt1, t1k, Br), what));
    TRY(gemm_backward(be, tmp, dv + (size_t)k * r * d, NULL, dt1, NULL, xl, v + (size_t)k * r * d, B, d, r));
    TRY(cuda_status(cuk_add(st, dxl, tmp, Bd), what));
  }
  return DLREC_OK;
}

/* ---- batch-invariant scoring: packed layers ----
 *
 * A packed layer here is the weight transposed to (IN, OUT) and the bias in
 * device memory; each output is the fma chain of the packed layer's contract (ops.h),
 * which the CPU's packed layer computes with the same roundings where it
 * has FMA, so the two score alike bit for bit. */

typedef struct cuda_packed {
  int in, out;
  float *wt;   /* (IN, OUT) */
  float *bias; /* (OUT), or NULL */
} cuda_packed;

void cuda_packed_free(dlrec_backend *be, dlrec_packed_linear *pl) {
  cuda_packed *p = (cuda_packed *)pl;
  if (!p) return;
  enter(be);
  cudaFree(p->wt);
  cudaFree(p->bias);
  free(p);
}

dlrec_status cuda_packed_create(dlrec_backend *be, dlrec_packed_linear **out, const float *weight,
                                const float *bias, int IN, int OUT) {
  TRY(nn_check_packed(out, weight, IN, OUT));
  cuda_packed *p = calloc(1, sizeof *p);
  float *wt = malloc((size_t)IN * OUT * sizeof(float));
  dlrec_status s = DLREC_OK;
  if (!p || !wt) s = dlrec_error(DLREC_ERR_NOMEM, "packed_linear_create: out of memory");
  if (s == DLREC_OK) {
    for (int o = 0; o < OUT; o++)
      for (int k = 0; k < IN; k++) wt[(size_t)k * OUT + o] = weight[(size_t)o * IN + k];
    p->in = IN, p->out = OUT;
    p->wt = cuda_alloc(be, (size_t)IN * OUT * sizeof(float));
    p->bias = bias ? cuda_alloc(be, (size_t)OUT * sizeof(float)) : NULL;
    if (!p->wt || (bias && !p->bias))
      s = dlrec_error(DLREC_ERR_NOMEM, "packed_linear_create: no GPU memory for a %dx%d layer", IN, OUT);
  }
  if (s == DLREC_OK) s = cuda_upload(be, p->wt, wt, (size_t)IN * OUT * sizeof(float));
  if (s == DLREC_OK && bias) s = cuda_upload(be, p->bias, bias, (size_t)OUT * sizeof(float));
  free(wt);
  if (s != DLREC_OK) {
    if (p) cuda_packed_free(be, (dlrec_packed_linear *)p);
    return s;
  }
  *out = (dlrec_packed_linear *)p;
  return DLREC_OK;
}

static dlrec_status packed_run(dlrec_backend *be, float *out, const dlrec_packed_linear *pl, const float *in, int B,
                               int relu, const char *what) {
  const cuda_packed *p = (const cuda_packed *)pl;
  return cuda_status(cuk_packed_forward(enter(be), out, p->wt, p->bias, in, B, p->in, p->out, relu), what);
}

dlrec_status cuda_packed_forward(dlrec_backend *be, float *out, const dlrec_packed_linear *p, const float *in,
                                 int B, dlrec_act act) {
  if (!p || !in || !out) return dlrec_error(DLREC_ERR_INVALID, "packed_linear_forward: NULL argument");
  if (B < 1) return dlrec_error(DLREC_ERR_INVALID, "packed_linear_forward: bad batch size B=%d", B);
  return packed_run(be, out, p, in, B, act == DLREC_ACT_RELU, "packed_linear_forward");
}

dlrec_status cuda_cross_infer(dlrec_backend *be, float *out, const float *x0, const float *xl,
                              const dlrec_packed_linear *w, int B, int d) {
  if (!out || !x0 || !xl || !w) return dlrec_error(DLREC_ERR_INVALID, "cross_infer: NULL argument");
  TRY(nn_check_cross("cross_infer", B, d, 0));
  TRY(packed_run(be, out, w, xl, B, 0, "cross_infer")); /* u (B, d), in out */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, out, xl, (size_t)B * d), "cross_infer");
}

dlrec_status cuda_cross_lowrank_infer(dlrec_backend *be, float *out, float *ws, const float *x0,
                                      const float *xl, const dlrec_packed_linear *v,
                                      const dlrec_packed_linear *u, int B, int d, int r) {
  if (!out || !ws || !x0 || !xl || !v || !u)
    return dlrec_error(DLREC_ERR_INVALID, "cross_lowrank_infer: NULL argument");
  TRY(nn_check_cross_lowrank("cross_lowrank_infer", B, d, r));
  TRY(packed_run(be, ws, v, xl, B, 0, "cross_lowrank_infer"));  /* t (B, r) */
  TRY(packed_run(be, out, u, ws, B, 0, "cross_lowrank_infer")); /* u (B, d), in out */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, out, xl, (size_t)B * d), "cross_lowrank_infer");
}

dlrec_status cuda_cross_mix_infer(dlrec_backend *be, float *out, float *ws, const float *x0, const float *xl,
                                  const dlrec_packed_linear *const *v, const dlrec_packed_linear *const *c,
                                  const dlrec_packed_linear *const *u, const dlrec_packed_linear *gate, int B,
                                  int d, int r, int K) {
  const char *what = "cross_mix_infer";
  if (!out || !ws || !x0 || !xl || !v || !c || !u || !gate)
    return dlrec_error(DLREC_ERR_INVALID, "%s: NULL argument", what);
  TRY(nn_check_cross_mix(what, B, d, r, K));
  for (int k = 0; k < K; k++)
    if (!v[k] || !c[k] || !u[k]) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL layer of expert %d", what, k);
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  float *t1 = ws, *t2 = t1 + Br, *e = t2 + Br, *p = e + Bd;
  cudaStream_t st = enter(be);
  TRY(packed_run(be, p, gate, xl, B, 0, what));
  TRY(cuda_status(cuk_softmax_rows(st, p, B, K), what));
  TRY(cuda_status(cuk_fill_rows(st, out, Bd, 1, Bd, 0.0f), what));
  for (int k = 0; k < K; k++) { /* the experts into out in k order, as the training forward's mixture */
    TRY(packed_run(be, t1, v[k], xl, B, 1, what));
    TRY(packed_run(be, t2, c[k], t1, B, 1, what));
    TRY(packed_run(be, e, u[k], t2, B, 0, what));
    TRY(cuda_status(cuk_mixture_add(st, out, p, e, B, d, K, k), what));
  }
  return cuda_status(cuk_cross_gate(st, out, x0, out, xl, Bd), what);
}

