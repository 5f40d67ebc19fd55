"""SASRec (RecBole 1.2.1) on gencli's exported split; run by the RecBole venv's python, never by gencli's.

    bench/.cache/venvs/recbole/bin/python bench/recbole_runner.py --data DIR --dataset NAME --seed 0 --out R.json

DIR/NAME/ holds NAME.train.inter, NAME.valid.inter and NAME.test.inter (written by bench/baselines.py);
RecBole's ``benchmark_filename`` makes it use those rows as they are instead of splitting on its own.
Hyperparameters are RecBole's SASRec defaults (CE loss, early stopping on validation MRR@10), one torch thread.

The JSON written to --out holds what the caller needs to check and score the run without trusting RecBole:
- ``presented``: the valid and test rows exactly as RecBole's eval dataloaders hand them to the model
  (user, history, target, mapped back to our tokens) and a digest of the training rows;
- ``test_ranks``: the 1-based rank of each test target among ALL items by the best model's scores
  (no history masking, ties broken towards the lower token), from which the caller computes Recall/NDCG;
- ``test_top``: per test row [user, target, the TOP_ITEMS best item tokens in that order], from which the caller
  ranks with the user's whole history masked (gencli recommend's policy; SASRec itself sees the last 50 items);
- ``recbole_test``: RecBole's own test metrics, for a sanity check only.
This file imports only RecBole, torch and the standard library (the venv has no gencli).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

_torch_load = torch.load


def _load_full(*args, **kwargs):
    """RecBole's checkpoints hold its Config object, which torch>=2.6 refuses under weights_only=True."""
    kwargs["weights_only"] = False
    return _torch_load(*args, **kwargs)


torch.load = _load_full


def _numpy2_aliases() -> None:
    """RecBole 1.2.1's Config aliases np.float, np.complex and np.unicode to np.float_, np.complex_ and np.unicode_,
    which NumPy 2 removed: give them back (same types) so it runs beside NumPy 1 or 2."""
    import numpy as np

    for old, new in (("float_", np.float64), ("complex_", np.complex128), ("unicode_", np.str_)):
        if old not in np.__dict__:
            setattr(np, old, new)


def _pandas_elementwise_len() -> None:
    """RecBole 1.2.1 takes per-row lengths of token sequences as ``Series.agg(len)``; pandas >= 2.2 applies ``len``
    to the whole Series there (one number, and then 'Length of values (1) does not match'). Map ``len`` over the
    rows, which is what older pandas did; every other ``agg`` is unchanged."""
    import pandas as pd

    agg = pd.Series.agg
    if getattr(agg, "gencli_shim", False):
        return

    def elementwise_len(self, func=None, *args, **kwargs):
        return self.map(len) if func is len else agg(self, func, *args, **kwargs)

    elementwise_len.gencli_shim = True
    pd.Series.agg = pd.Series.aggregate = elementwise_len


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="folder holding DATASET/DATASET.{train,valid,test}.inter")
    p.add_argument("--dataset", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=0, help="0 = RecBole's default (300, with early stopping)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: train and score on the GPU (RecBole's use_gpu); the split and settings are the same")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="score this saved RecBole checkpoint (e.g. the best one of a killed run) instead of training")
    return p.parse_args()


def rows_of(loader, dataset) -> list[list]:
    """[user, [history tokens], target] for every row an eval dataloader presents, in its order."""
    uid, iid = dataset.uid_field, dataset.iid_field
    seq, seq_len = dataset.item_id_list_field, dataset.item_list_length_field
    out = []
    for batch in loader:
        inter = batch[0]
        users = dataset.id2token(uid, inter[uid].numpy())
        targets = dataset.id2token(iid, inter[iid].numpy())
        for i in range(len(inter)):
            n = int(inter[seq_len][i])
            hist = dataset.id2token(iid, inter[seq][i, :n].numpy())
            out.append([str(users[i]), [str(t) for t in hist], str(targets[i])])
    return out


def train_digest(dataset) -> tuple[str, int]:
    """sha256 of the sorted 'user|h1 h2 ...|target' lines of the training rows RecBole trains on, and their count."""
    feat = dataset.inter_feat
    uid, iid = dataset.uid_field, dataset.iid_field
    users = dataset.id2token(uid, feat[uid].numpy())
    targets = dataset.id2token(iid, feat[iid].numpy())
    seqs, lens = feat[dataset.item_id_list_field].numpy(), feat[dataset.item_list_length_field].numpy()
    lines = sorted(f"{users[i]}|{' '.join(dataset.id2token(iid, seqs[i, :lens[i]]))}|{targets[i]}"
                   for i in range(len(feat)))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest(), len(lines)


TOP_ITEMS = 1000  # items of each test row's ranking kept for the caller's seen-masked ranks


@torch.no_grad()
def test_ranks(model, loader, dataset, tops: list | None = None) -> list[list]:
    """[user, target, rank] per test row: 1 + items scoring higher (+ equal items with a lower token id); ``tops``
    receives [user, target, best TOP_ITEMS tokens] per row."""
    model.eval()
    uid, iid = dataset.uid_field, dataset.iid_field
    tokens = dataset.field2id_token[iid]
    # Tie-break by our item token (the gencli item_idx) rather than RecBole's internal order.
    order_key = torch.tensor([int(t) if t != "[PAD]" else -1 for t in tokens])
    out = []
    device = next(model.parameters()).device
    for batch in loader:
        inter = batch[0].to(device)
        scores = model.full_sort_predict(inter).view(len(inter), -1).float().cpu()  # ranked here, on the CPU
        scores[:, 0] = -torch.inf  # RecBole's padding item
        target = inter[iid].cpu()
        t_score = scores.gather(1, target[:, None])
        higher = (scores > t_score).sum(1)
        ties = ((scores == t_score) & (order_key[None, :] < order_key[target][:, None])).sum(1)
        ranks = (1 + higher + ties).tolist()
        users = dataset.id2token(uid, inter[uid].cpu().numpy())
        for u, t, r in zip(users, target.tolist(), ranks, strict=True):
            out.append([str(u), str(tokens[t]), int(r)])
        if tops is not None:
            # score descending, ties by our token ascending: sort by token first, then stably by score
            by_token = torch.argsort(order_key, stable=True)
            ordered = by_token[torch.argsort(scores[:, by_token], dim=1, descending=True, stable=True)]
            best = ordered[:, :TOP_ITEMS]
            for u, t, row in zip(users, target.tolist(), best.tolist(), strict=True):
                tops.append([str(u), str(tokens[t]), [str(tokens[i]) for i in row if i != 0]])
    return out


def main() -> None:
    args = parse_args()
    args.data, args.out = args.data.resolve(), args.out.resolve()
    args.checkpoint = args.checkpoint.resolve() if args.checkpoint else None
    sys.argv = sys.argv[:1]  # RecBole's Config also reads --key=value from the command line
    torch.set_num_threads(1)
    _numpy2_aliases()
    _pandas_elementwise_len()
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.model.sequential_recommender import SASRec
    from recbole.trainer import Trainer
    from recbole.utils import init_logger, init_seed

    work = args.out.parent / (args.out.stem + "-recbole")
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # RecBole writes ./log and ./log_tensorboard into the working directory
    settings = {
        "data_path": str(args.data),
        "benchmark_filename": ["train", "valid", "test"],
        "load_col": {"inter": ["user_id", "item_id_list", "item_id"]},
        "alias_of_item_id": ["item_id_list"],  # one token -> id map for histories and targets
        "train_neg_sample_args": None,  # required by CE loss (SASRec's default loss)
        "seed": args.seed, "reproducibility": True,
        "use_gpu": args.device == "cuda", "gpu_id": "0", "worker": 0, "show_progress": False,
        "checkpoint_dir": str(work / "saved"), "save_dataset": False, "save_dataloaders": False,
    }
    if args.epochs:
        settings["epochs"] = args.epochs
    config = Config(model="SASRec", dataset=args.dataset, config_dict=settings)
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)  # epoch losses and times -> ./log/ and the caller's log file
    dataset = create_dataset(config)
    train_data, valid_data, test_data = data_preparation(config, dataset)
    init_seed(config["seed"] + config["local_rank"], config["reproducibility"])
    model = SASRec(config, train_data._dataset).to(config["device"])
    trainer = Trainer(config, model)
    epochs = []
    train_epoch = trainer._train_epoch
    trainer._train_epoch = lambda *a, **k: (epochs.append(1), train_epoch(*a, **k))[1]
    t0 = time.time()
    if args.checkpoint is None:
        best_score, best_valid = trainer.fit(train_data, valid_data, saved=True, show_progress=False)
        model_file, best_epoch = None, len(epochs) - 1 - trainer.cur_step  # cur_step: evals since the best
    else:
        saved = torch.load(args.checkpoint, map_location=config["device"])
        model.load_state_dict(saved["state_dict"])
        best_valid = trainer.evaluate(valid_data, load_best_model=False, show_progress=False)
        best_score, model_file = saved["best_valid_score"], str(args.checkpoint)
        best_epoch = saved["epoch"]
    train_s = time.time() - t0
    recbole_test = trainer.evaluate(test_data, load_best_model=True, model_file=model_file, show_progress=False)
    digest, n_train = train_digest(train_data._dataset)
    tops: list = []
    result = {
        "seed": args.seed, "train_seconds": round(train_s, 1), "best_valid_score": float(best_score),
        "best_valid": {k: float(v) for k, v in best_valid.items()},
        "recbole_test": {k: float(v) for k, v in recbole_test.items()},
        "epochs_run": len(epochs), "best_epoch": best_epoch,
        "from_checkpoint": str(args.checkpoint) if args.checkpoint else None,
        "items": int(dataset.item_num) - 1, "torch_threads": torch.get_num_threads(), "device": args.device,
        "versions": {"torch": torch.__version__, "numpy": __import__("numpy").__version__,
                     "pandas": __import__("pandas").__version__},
        "config": {k: config[k] for k in ("epochs", "train_batch_size", "learning_rate", "stopping_step",
                                          "valid_metric", "MAX_ITEM_LIST_LENGTH", "loss_type", "hidden_size",
                                          "n_layers", "n_heads", "inner_size", "hidden_dropout_prob",
                                          "attn_dropout_prob", "eval_step")},
        "presented": {"valid": rows_of(valid_data, valid_data._dataset), "test": rows_of(test_data, test_data._dataset),
                      "train_digest": digest, "train_rows": n_train},
        "test_ranks": test_ranks(trainer.model, test_data, test_data._dataset, tops),
        "test_top": tops,
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
