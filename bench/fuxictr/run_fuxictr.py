#!/usr/bin/env python3
"""One model trained by FuxiCTR on bench/fuxictr/data.py's CSVs, under the BARS protocol.

usage: run_fuxictr.py --data DIR --work DIR --model lr|fm|dnn|wide_deep|deepfm|dcn_v2|dlrm
                      --params PARAMS.json [--threads 2] [--out RESULT.json]

DIR holds train.csv, valid.csv, test.csv and info.json (data.py). FuxiCTR's own
pipeline reads them: FeatureProcessor (every column categorical, `str`, min_categr_count
as PARAMS says: FuxiCTR's vocabulary keeps a value seen at least that often in the
training file, as `dlrec etl fit --min-count` does), build_dataset (parquet files under
--work, built once per data set) and RankDataLoader (parquet; the training rows shuffled
each epoch; num_workers 1: one loader process beside the training loop, as dlrec's
loader thread runs beside its compute threads). The model is one of FuxiCTR's
BaseModel, composed from the wheel's layers exactly as FuxiCTR's model_zoo composes
it (no wheel ships model_zoo): FeatureEmbedding (N(0, 1e-4)), LogisticRegression,
FactorizationMachine, MLP_Block, CrossNetV2, InnerProductInteraction. BaseModel.fit is
FuxiCTR's training loop: torch.optim.Adam over every parameter, the embedding
regularizer over the whole tables every step, gradient norm clipped to 10, validation
after each epoch, learning rate x0.1 on every validation that does not improve on the
best AUC, early stop after `early_stop_patience` of those, and the best weights restored.

PARAMS (JSON, the same numbers bench/fuxictr_vs.sh writes into dlrec's config):
  embedding_dim, learning_rate, batch_size, epochs, seed, embedding_regularizer,
  hidden_units, net_dropout, batch_norm, num_cross_layers, early_stop_patience,
  min_categr_count.
Prints (and writes to --out) one JSON object: valid_auc (per epoch), valid_logloss,
best_epoch (1-based), epochs_run, test_auc, test_logloss, train_rows, train_s (the
training loop, data loading included, validations excluded), samples_per_s.
"""
import argparse
import json
import logging
import os
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn

# FuxiCTR 2.3.9's BaseModel.fit starts from np.Inf, which numpy 2 removed (np.inf stays).
if not hasattr(np, "Inf"):
    np.Inf = np.inf
# FuxiCTR's metrics pass log_loss the eps that scikit-learn 1.4 deprecates; the warning says nothing here.
warnings.filterwarnings("ignore", category=FutureWarning)

from fuxictr.features import FeatureMap  # noqa: E402
from fuxictr.preprocess import FeatureProcessor, build_dataset  # noqa: E402
from fuxictr.pytorch.dataloaders import RankDataLoader  # noqa: E402
from fuxictr.pytorch.layers import (CrossNetV2, FactorizationMachine, FeatureEmbedding,  # noqa: E402
                                    InnerProductInteraction, LogisticRegression, MLP_Block)
from fuxictr.pytorch.models import BaseModel  # noqa: E402
from fuxictr.pytorch.torch_utils import seed_everything  # noqa: E402


class Timed(BaseModel):
    """BaseModel recording each validation (its AUC and logloss) and the time spent in them."""

    def record_init(self):
        self.history = []
        self.eval_s = 0.0

    def eval_step(self):
        t0 = time.perf_counter()
        logs = self.evaluate(self.valid_gen, metrics=["AUC", "logloss"])
        self.history.append({"auc": float(logs["AUC"]), "logloss": float(logs["logloss"])})
        self.checkpoint_and_earlystop(logs)
        self.train()
        self.eval_s += time.perf_counter() - t0


def mlp(p, input_dim, output_dim=1, output_activation=None, dropout_key="net_dropout"):
    return MLP_Block(input_dim=input_dim, output_dim=output_dim, hidden_units=p["hidden_units"],
                     hidden_activations="ReLU", output_activation=output_activation,
                     dropout_rates=p[dropout_key], batch_norm=p["batch_norm"])


def build_model(name, fmap, p, base):
    """FuxiCTR's model_zoo model NAME (LR, FM, DNN, WideDeep, DeepFM, DCNv2 parallel, DLRM), on FMAP."""
    emb_dim = p["embedding_dim"]
    reg = p["embedding_regularizer"]

    class Model(Timed):
        def __init__(self):
            super().__init__(fmap, model_id=name, gpu=-1, embedding_regularizer=reg, net_regularizer=0, **base)
            if name in ("fm", "dnn", "wide_deep", "deepfm", "dcn_v2", "dlrm"):
                self.embedding_layer = FeatureEmbedding(fmap, emb_dim)
            flat = fmap.sum_emb_out_dim()
            if name == "lr":
                self.lr_layer = LogisticRegression(fmap, use_bias=True)
            elif name in ("fm", "deepfm"):
                self.fm = FactorizationMachine(fmap)
            elif name == "wide_deep":
                self.lr_layer = LogisticRegression(fmap, use_bias=False)
            if name in ("wide_deep", "deepfm"):
                self.mlp = mlp(p, flat)
            elif name == "dnn":
                self.mlp = mlp(p, flat, output_activation=self.output_activation)
            elif name == "dcn_v2":
                self.crossnet = CrossNetV2(flat, p["num_cross_layers"])
                self.parallel_dnn = mlp(p, flat, output_dim=None)
                self.fc = nn.Linear(flat + p["hidden_units"][-1], 1)
            elif name == "dlrm":
                n = fmap.num_fields
                self.interact = InnerProductInteraction(num_fields=n, output="inner_product")
                self.top_mlp = mlp(p, n * (n - 1) // 2, output_activation=self.output_activation)
            self.compile("adam", "binary_crossentropy", p["learning_rate"])
            self.reset_parameters()
            self.model_to_device()
            self.record_init()

        def forward(self, inputs):
            X = self.get_inputs(inputs)
            if name == "lr":
                return {"y_pred": self.output_activation(self.lr_layer(X))}
            emb = self.embedding_layer(X)  # (B, F, D)
            if name == "fm":
                y = self.fm(X, emb)
            elif name == "deepfm":
                y = self.fm(X, emb) + self.mlp(emb.flatten(start_dim=1))
            elif name == "wide_deep":
                y = self.lr_layer(X) + self.mlp(emb.flatten(start_dim=1))
            elif name == "dnn":
                return {"y_pred": self.mlp(emb.flatten(start_dim=1))}
            elif name == "dlrm":
                return {"y_pred": self.top_mlp(self.interact(emb))}
            else:  # dcn_v2, parallel
                x0 = emb.flatten(start_dim=1)
                y = self.fc(torch.cat([self.crossnet(x0), self.parallel_dnn(x0)], dim=-1))
            return {"y_pred": self.output_activation(y)}

    return Model()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--model", required=True,
                    choices=["lr", "fm", "dnn", "wide_deep", "deepfm", "dcn_v2", "dlrm"])
    ap.add_argument("--params", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    p = json.load(open(args.params))
    info = json.load(open(os.path.join(args.data, "info.json")))
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.set_num_threads(args.threads)
    seed_everything(p["seed"])

    # The data set: parquet and feature map built once per data set and vocabulary policy.
    dataset_id = "%s_min%d" % (info["dataset"], p["min_categr_count"])
    fp = FeatureProcessor(feature_cols=[{"name": info["categorical"], "active": True, "dtype": "str",
                                         "type": "categorical"}],
                          label_col={"name": info["label"], "dtype": "float"},
                          dataset_id=dataset_id, data_root=args.work)
    csv = {k: os.path.join(args.data, k + ".csv") for k in ("train", "valid", "test")}
    train, valid, test = build_dataset(fp, train_data=csv["train"], valid_data=csv["valid"],
                                       test_data=csv["test"], min_categr_count=p["min_categr_count"])
    fmap = FeatureMap(dataset_id, fp.data_dir)
    fmap.load(os.path.join(fp.data_dir, "feature_map.json"), {"embedding_dim": p["embedding_dim"]})
    seed_everything(p["seed"])
    loader = dict(data_format="parquet", batch_size=p["batch_size"], num_workers=1)
    train_gen, valid_gen = RankDataLoader(fmap, stage="train", train_data=train, valid_data=valid,
                                          shuffle=True, **loader).make_iterator()
    test_gen = RankDataLoader(fmap, stage="test", test_data=test, shuffle=False, **loader).make_iterator()

    base = dict(model_root=os.path.join(args.work, "checkpoints"), verbose=0, metrics=["AUC", "logloss"],
                monitor="AUC", monitor_mode="max", early_stop_patience=p["early_stop_patience"],
                reduce_lr_on_plateau=True, save_best_only=True)
    os.makedirs(os.path.join(base["model_root"], dataset_id), exist_ok=True)
    model = build_model(args.model, fmap, p, base)
    t0 = time.perf_counter()
    model.fit(train_gen, epochs=p["epochs"], validation_data=valid_gen, max_gradient_norm=10.0)
    train_s = time.perf_counter() - t0 - model.eval_s
    test_logs = model.evaluate(test_gen, metrics=["AUC", "logloss"])
    aucs = [h["auc"] for h in model.history]
    rows = model._total_steps * p["batch_size"]
    rows = min(rows, len(model.history) * train_gen.num_samples) if model.history else rows
    out = {"engine": "fuxictr", "model": args.model, "valid_auc": aucs,
           "valid_logloss": [h["logloss"] for h in model.history],
           "best_epoch": int(np.argmax(aucs)) + 1, "epochs_run": len(aucs),
           "test_auc": float(test_logs["AUC"]), "test_logloss": float(test_logs["logloss"]),
           "train_rows": int(rows), "train_s": train_s, "samples_per_s": rows / train_s,
           "threads": args.threads, "vocab_rows": int(fmap.total_features)}
    text = json.dumps(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
