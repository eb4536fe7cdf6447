#!/usr/bin/env python3
"""TorchRec + FBGEMM (CPU) DLRM, the peer that bench/train_vs_torchrec.sh measures dlrec against.

Runs in the venv that bench/torchrec/setup.sh builds (.venv-torchrec/bin/python).

The model is examples/dlrm_criteo.json's, the Criteo Kaggle DLRM, built from
TorchRec's own parts:

  - torchrec.models.dlrm.DLRM: 26 tables of dim 16 with sum pooling, one per
    sparse column (rows = id_end - id_begin of the column in the .dlr file),
    bottom MLP 13-512-256-64-16, dot interaction without self-interaction
    (16 + 351 = 367 features; TorchRec orders the 351 pairs differently from
    dlrec, which permutes the top MLP's inputs and changes nothing else), top
    MLP 367-512-256-1, BCE with logits (mean);
  - the tables through EmbeddingBagCollection + apply_optimizer_in_backward(SGD)
    + DistributedModelParallel (gloo, world size 1, an in-process HashStore, no
    network), the planner held to table_wise sharding and the "fused" kernel:
    FBGEMM's table-batched embedding (SplitTableBatchedEmbeddingBagsCodegen)
    with the SGD update fused into the backward pass (EXACT_SGD), TorchRec's
    production training path; bench/torchrec/check_equivalence.py checks that
    it equals plain EmbeddingBag + torch.optim.SGD;
  - dense parameters: torch.optim.SGD (fused=True where torch has it); lr 0.1
    on both sides, as the config;
  - init as bench/torch_dlrm.py and the DLRM reference: embeddings
    U(-sqrt(1/n), sqrt(1/n)), MLP weights N(0, sqrt(2/(in+out))), biases
    N(0, sqrt(1/out)); TorchRec's own defaults are replaced.

Data: the .dlr files that `dlrec etl apply` writes, the same files
bench/torch_dlrm.py reads, through its reader (Dlr) and its shuffle (row
groups permuted, cut into windows of --window-groups groups, each window's
slices of --slice-rows rows permuted). The batches are built as tensors and
KeyedJaggedTensors before the clock starts, as TorchRec's recipe does, so
samples/s is the training loop alone; --time-loading builds each batch inside
the timed loop instead, as dlrec and bench/torch_dlrm.py count it.

--bf16 runs forward and loss under torch.autocast("cpu", bfloat16), in training
and evaluation: the MLPs' matmuls in bf16 (oneDNN; AMX or avx512_bf16 where the
CPU has them, emulated otherwise), the tables and the optimizer in fp32.

Evaluation (not timed): exact AUC by ranking, logloss from the logits,
calibration (mean prediction / observed CTR). Prints one JSON line:
  {"engine":"torchrec","batch":B,"threads":N,"bf16":..,"samples_per_s":..,"auc":..,...}
Progress notes go to stderr.
"""
import argparse
import json
import math
import os
import platform
import resource
import sys
import time
import warnings
from contextlib import nullcontext
from importlib import metadata

import numpy as np

EMB_DIM = 16  # examples/dlrm_criteo.json: model.embedding_dim


def log(*a):
    print("[trec_dlrm]", *a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True, help="training rows (.dlr)")
    ap.add_argument("--valid", required=True, help="validation rows (.dlr)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast('cpu', bfloat16) around forward + loss")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD lr of the tables (fused) and of the dense parameters")
    ap.add_argument("--max-rows", type=int, default=0, help="train on at most this many rows (0: all)")
    ap.add_argument("--max-valid-rows", type=int, default=0, help="evaluate on at most this many rows (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--window-groups", type=int, default=8)
    ap.add_argument("--slice-rows", type=int, default=32)
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--eval-batch", type=int, default=4096)
    ap.add_argument("--time-loading", action="store_true",
                    help="build each batch inside the timed loop (as dlrec counts it) instead of before it")
    a = ap.parse_args()
    if a.batch < 1 or a.threads < 1 or a.eval_batch < 1:
        raise SystemExit("trec_dlrm: --batch, --threads and --eval-batch must be at least 1")

    # The thread count must be fixed before torch does any parallel work.
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    warnings.filterwarnings("ignore")
    import logging
    for name in ("torchrec", "torch.fx._symbolic_trace", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
    import torch.distributed as dist
    import torchrec
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    # The .dlr reader, the shuffle and the AUC are bench/torch_dlrm.py's, so that
    # both peers read the same rows the same way.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from torch_dlrm import Dlr, auc_exact, batches

    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    tr, va = Dlr(a.train), Dlr(a.valid)
    if tr.n_dense != 13 or tr.n_sparse != 26:
        raise SystemExit(f"{a.train}: {tr.n_dense} dense and {tr.n_sparse} sparse columns; "
                         "the Criteo DLRM needs 13 and 26")
    if [e - b for b, e in va.cols] != [e - b for b, e in tr.cols] or va.n_dense != tr.n_dense:
        raise SystemExit(f"{a.valid}: its columns differ from {a.train}'s (not encoded with the same ETL)")
    nd, ns = tr.n_dense, tr.n_sparse
    sizes = [e - b for b, e in tr.cols]

    # ---------------- model ----------------
    feat = [f"cat_{j}" for j in range(ns)]
    configs = [EmbeddingBagConfig(name=f"t_cat_{j}", embedding_dim=EMB_DIM, num_embeddings=sizes[j],
                                  feature_names=[feat[j]], pooling=torchrec.PoolingType.SUM)
               for j in range(ns)]
    cpu = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    base = DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=configs, device=torch.device("meta")),
                dense_in_features=nd, dense_arch_layer_sizes=[512, 256, 64, 16],
                over_arch_layer_sizes=[512, 256, 1], dense_device=cpu)
    apply_optimizer_in_backward(torch.optim.SGD, base.sparse_arch.parameters(), {"lr": a.lr})
    cons = {c.name: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value],
                                         compute_kernels=[EmbeddingComputeKernel.FUSED.value])
            for c in configs}
    sharders = [EmbeddingBagCollectionSharder()]
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    batch_size=a.batch, constraints=cons).plan(base, sharders)
    model = DistributedModelParallel(module=base, device=cpu, plan=plan, sharders=sharders,
                                     init_data_parallel=False)
    dense_params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]

    # The FBGEMM TBE modules actually used (this proves the fused path is in
    # effect) and each table's weights inside them.
    sebc = model._dmp_wrapped_module.sparse_arch.embedding_bag_collection
    wrappers = [em for lk in sebc._lookups for em in lk._emb_modules]
    tbe = [getattr(w, "_emb_module", None) for w in wrappers]
    tbe_desc = ", ".join(f"{type(w).__name__}/{type(t).__name__}(optimizer={getattr(t, 'optimizer', None)}, "
                         f"lr={t.get_learning_rate():g}, tables={len(t.embedding_specs)})"
                         for w, t in zip(wrappers, tbe))
    if not all(type(t).__name__ == "SplitTableBatchedEmbeddingBagsCodegen" for t in tbe):
        raise SystemExit(f"trec_dlrm: expected FBGEMM TBE modules, got: {tbe_desc}")
    table_w = {}
    for w in wrappers:
        for c, t in zip(w.config.embedding_tables, w.split_embedding_weights()):
            table_w[c.name] = t
    if sorted(table_w) != sorted(c.name for c in configs):
        raise SystemExit(f"trec_dlrm: the TBE modules hold tables {sorted(table_w)}, not the 26 configured")

    # The DLRM reference's init, as bench/torch_dlrm.py and dlrec draw it.
    with torch.no_grad():
        for c in configs:
            w = table_w[c.name]
            if tuple(w.shape) != (c.num_embeddings, EMB_DIM):
                raise SystemExit(f"trec_dlrm: table {c.name} is {tuple(w.shape)}, expected "
                                 f"({c.num_embeddings}, {EMB_DIM})")
            bound = math.sqrt(1.0 / c.num_embeddings)
            w.uniform_(-bound, bound)
        n_linear = 0
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                n, o = m.in_features, m.out_features
                m.weight.normal_(0.0, math.sqrt(2.0 / (n + o)))
                m.bias.normal_(0.0, math.sqrt(1.0 / o))
                n_linear += 1
        if n_linear != 7:
            raise SystemExit(f"trec_dlrm: {n_linear} linear layers, expected 4 bottom + 3 top")

    try:
        dense_opt = torch.optim.SGD(dense_params, lr=a.lr, fused=True)
        dense_opt_kind = "SGD(fused=True)"
    except Exception:  # a torch without the CPU fused SGD
        dense_opt = torch.optim.SGD(dense_params, lr=a.lr)
        dense_opt_kind = "SGD"
    log(f"TBE: {tbe_desc}; {sum(p.numel() for p in dense_params)} dense parameters with {dense_opt_kind}")

    # ---------------- batches ----------------
    lens_cache = {}

    def to_tensors(lab, dense, ids):
        """numpy (n,), (n, 13), (n, 26) local ids -> dense (n, 13), KJT (feature-major), labels (n,)."""
        n = lab.shape[0]
        if n not in lens_cache:
            lens_cache[n] = (torch.ones(ns * n, dtype=torch.int32), torch.arange(ns * n + 1, dtype=torch.int32))
        lengths, offsets = lens_cache[n]
        values = torch.from_numpy(np.ascontiguousarray(ids.T, dtype=np.int32)).view(-1)  # (26 * n,)
        return (torch.from_numpy(np.ascontiguousarray(dense)),
                KeyedJaggedTensor(keys=feat, values=values, lengths=lengths, offsets=offsets),
                torch.from_numpy(np.ascontiguousarray(lab)))

    def train_stream():
        return batches(tr, a.batch, not a.no_shuffle, rng, a.window_groups, a.slice_rows, a.max_rows)

    prebuilt = None if a.time_loading else [to_tensors(*b) for b in train_stream()]
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.bf16 else nullcontext
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    # ---------------- timed training loop ----------------
    model.train()
    samples = steps = 0
    loss_sum = torch.zeros((), dtype=torch.float64)
    t_first = None
    t0 = time.perf_counter()
    for b in (prebuilt if prebuilt is not None else train_stream()):
        d, kjt, y = b if prebuilt is not None else to_tensors(*b)
        with amp():
            logits = model(d, kjt).squeeze(-1)
            loss = bce(logits.float(), y)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()  # the fused TBE backward updates the embedding rows here
        dense_opt.step()
        loss_sum += loss.detach() * y.shape[0]
        samples += int(y.shape[0])
        steps += 1
        if t_first is None:
            t_first = time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    del prebuilt

    # ---------------- evaluation (not timed) ----------------
    model.eval()
    ys, zs = [], []
    with torch.no_grad():
        for lab, dense, ids in batches(va, a.eval_batch, False, rng, 1, 1, a.max_valid_rows):
            d, kjt, _ = to_tensors(lab, dense, ids)
            with amp():
                zs.append(model(d, kjt).squeeze(-1).double().numpy())
            ys.append(lab.astype(np.float64))
    y = np.concatenate(ys)
    z = np.concatenate(zs)
    logloss = float(np.mean(np.logaddexp(0.0, z) - y * z))  # softplus(z) - y z, stable for any z
    auc = auc_exact(y, z)  # the sigmoid is monotone: ranking the logits ranks the probabilities
    calibration = float(np.mean(1.0 / (1.0 + np.exp(-z))) / np.mean(y))

    print(json.dumps({
        "engine": "torchrec", "batch": a.batch, "threads": a.threads, "bf16": bool(a.bf16),
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "auc": auc, "logloss": logloss, "calibration": calibration,
        "samples": samples, "steps": steps, "seconds": seconds, "first_step_s": t_first,
        "train_logloss": float(loss_sum) / max(samples, 1), "valid_rows": int(y.shape[0]),
        "time_loading": bool(a.time_loading), "table_rows": int(sum(sizes)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "dense_opt": dense_opt_kind, "tbe": tbe_desc,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "torchrec": metadata.version("torchrec"), "fbgemm_gpu_cpu": metadata.version("fbgemm-gpu-cpu"),
                     "numpy": np.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()},
    }), flush=True)


if __name__ == "__main__":
    main()
