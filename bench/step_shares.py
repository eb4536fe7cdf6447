"""One row of bench/train_vs_torchrec.sh's last table: dlrec's training step
phase by phase (shares of the training loop's seconds, from `dlrec train`'s
"profile") and its MLPs' GFLOP/s against the GEMM limit of its precision
measured by bench_roofline in the same run (for fp32 the engine dlrec's fp32
GEMMs run on here, oneDNN's or OpenBLAS's sgemm; oneDNN's bf16 matmul for
bf16; "-" where oneDNN has no bf16 kernel for this CPU).

usage: step_shares.py DLREC_SUMMARY.json ROOFLINE.json BATCH PRECISION
"""
import json
import sys

d, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
b, prec = sys.argv[3], sys.argv[4]
p, secs = d["profile"], d["seconds"]
if prec == "fp32":
    limit = r["dnnl_f32_model_gflops"] if "oneDNN" in r["fp32_gemms"] else r["sgemm_model_gflops"]
else:
    limit = r.get("dnnl_bf16_model_gflops")


def share(k):
    return "%5.0f%%" % (100 * p[k] / secs)


lim = "%9.1f %6.0f%%" % (limit, 100 * p["mlp_gflops"] / limit) if limit else "%9s %7s" % ("-", "-")
print("%6s %-5s %9.1f %s %s %s %s %s %s %s" % (b, prec, p["mlp_gflops"], lim, share("mlp_seconds"),
      share("embedding_forward_seconds"), share("embedding_update_seconds"), share("interaction_seconds"),
      share("other_seconds"), share("loader_wait_seconds")))
