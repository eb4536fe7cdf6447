#!/usr/bin/env python3
"""The one set of hyper-parameters bench/fuxictr_vs.sh gives both engines, per model.

usage: configs.py MODEL --out-dir DIR --batch N --epochs N --seed N --emb-reg X --threads N
                  [--protocol fuxictr|lazy] [--min-count N]

Writes DIR/fuxictr.json (run_fuxictr.py's PARAMS) and DIR/dlrec.json (a `dlrec train`
config), the same numbers in both:
  every model   embedding_dim 10, Adam lr 1e-3 (dense and embeddings), L2 EMB_REG on the
                embeddings (FuxiCTR's embedding_regularizer), gradient norm clipped to 10,
                validation AUC after every epoch, lr x0.1 after every validation not better
                than the best by 1e-6 (down to 1e-6, FuxiCTR's min_lr), early stop after 2
                such validations, the best weights restored, batch BATCH, EPOCHS at most.
  dnn, wide_deep, deepfm, dcn_v2   MLP [400, 400, 400], dropout 0.2, batch norm (BARS's
                DeepFM/DCNv2 shape); dcn_v2 parallel with 3 full-rank cross layers.
  dlrm          no dense column: the dot products of the 8 (or 26) embeddings into a top
                MLP [400, 400, 400] with dropout 0.2 and batch norm.
  lr, fm        their only parameters are embeddings and a bias.
The protocol options of dlrec (--protocol fuxictr, the default): model.embedding_init
N(0, 1e-4) (FuxiCTR's FeatureEmbedding initializer), model.bias_init "zeros" (its
init_weights), optimizer.sparse.type "adam" (dense
Adam over every row, torch.optim.Adam) and l2_scope "table" (the regularizer over the
whole table every step). --protocol lazy: dlrec's own defaults instead (its uniform
initializer, lazy Adam and L2 on the touched rows only), for comparison.
"""
import argparse
import json
import os

MLP = [400, 400, 400]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=["lr", "fm", "dnn", "wide_deep", "deepfm", "dcn_v2", "dlrm"])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2019)
    ap.add_argument("--emb-reg", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-count", type=int, default=1)
    ap.add_argument("--protocol", choices=["fuxictr", "lazy"], default="fuxictr")
    a = ap.parse_args()
    m = a.model
    fx = {"embedding_dim": 10, "learning_rate": 1e-3, "batch_size": a.batch, "epochs": a.epochs,
          "seed": a.seed, "embedding_regularizer": a.emb_reg, "hidden_units": MLP, "net_dropout": 0.2,
          "batch_norm": True, "num_cross_layers": 3, "early_stop_patience": 2, "min_categr_count": a.min_count}

    model = {"type": m}
    if m != "lr":
        model["embedding_dim"] = 10
    if m in ("dnn", "wide_deep", "deepfm", "dcn_v2"):
        model.update(mlp=MLP, dropout=0.2, batch_norm=True)
    if m == "dcn_v2":
        model.update(structure="parallel", cross_layers=3, low_rank=0, experts=1)
    if m == "dlrm":
        model.update(bottom_mlp=[10], top_mlp=MLP + [1], top_mlp_dropout=0.2, top_mlp_batch_norm=True)
    sparse = {"type": "lazy_adam", "lr": 1e-3, "weight_decay": a.emb_reg}
    if a.protocol == "fuxictr":
        model["embedding_init"] = {"type": "normal", "std": 1e-4}
        model["bias_init"] = "zeros"
        sparse.update(type="adam", l2_scope="table")
    cfg = {
        "name": m, "model": model,
        "optimizer": {"dense": {"type": "adam", "lr": 1e-3}, "sparse": sparse, "clip_grad_norm": 10},
        "schedule": {"plateau_factor": 0.1, "plateau_patience": 0, "plateau_min_delta": 1e-6,
                     "plateau_min_scale": 1e-3},
        "training": {"batch_size": a.batch, "epochs": a.epochs, "threads": a.threads, "seed": a.seed,
                     "early_stopping_patience": 2, "early_stopping_min_delta": 1e-6, "restore_best": True},
        "eval": {"every_epoch": True, "metric": "auc", "batch_size": 4096, "train_rows": 0},
        "checkpoint": {"keep_best": True, "keep": 1},
        "log": {"interval_steps": 100000},
    }
    os.makedirs(a.out_dir, exist_ok=True)
    json.dump(fx, open(os.path.join(a.out_dir, "fuxictr.json"), "w"), indent=2)
    json.dump(cfg, open(os.path.join(a.out_dir, "dlrec.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
