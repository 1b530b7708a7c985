"""Export a model whose placement only scales Post-LN's residual to a plain Hugging Face BERT checkpoint.

    python -m pretrain.export --model=runs/lnbert-deepnorm/snapshots/step_00010000 --out=exported/deepnorm

For a scalar ``a > 0``, ``N(a x + F(x)) = N(x + F(x) / a)`` for LayerNorm (up to its eps, which becomes
``eps / a^2``): LayerNorm is invariant to scaling its input. So DeepNorm (``a = alpha``) and Admin with a fixed
omega compute the function of a Post-LN BERT whose sub-layer output projections (weight and bias) are divided by
``a``. The export writes that ``BertForPreTraining`` with ``save_pretrained`` (and the snapshot's tokenizer, if
any): a DeepNorm- or Admin-trained model then runs anywhere with no code of this project.
"""

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pretrain.common.atomic import atomic_dir
from pretrain.common.cli import parse, run_cli
from pretrain.placements import PLACEMENTS
from pretrain.run_folder.layout import MANIFEST_FILE
from pretrain.run_folder.manifest import verify_manifest

# torch, transformers and the model are imported inside the functions: the options are read and checked first. No
# `from __future__ import annotations`: jsonargparse would run the TYPE_CHECKING imports to resolve ExportConfig's.
if TYPE_CHECKING:
    from transformers import BertConfig, BertForPreTraining

    from pretrain.modeling import LNBertConfig, LNBertForPreTraining


@dataclass(kw_only=True)
class ExportConfig:
    """Export a Post-LN, DeepNorm or Admin (fixed omega) snapshot to a plain Hugging Face BERT folder."""

    model: str
    """A snapshot folder written by pretrain/run.py (config.json + model.safetensors)."""
    out: str
    """The folder to write the Hugging Face BERT checkpoint to (must not exist yet)."""


def check_exportable(config: "LNBertConfig") -> None:
    """Raise ``ValueError`` naming what keeps ``config`` from being plain BERT."""
    if not config.placement.exports_to_bert:
        exporting = ", ".join(name for name, p in PLACEMENTS.items() if p.exports_to_bert)
        raise ValueError(f"norm_placement={config.norm_placement!r} does not export to plain BERT: only {exporting} "
                         "(their residual scale folds into the output projections) do")  # fmt: skip
    if config.layer_parts(0).learned_skip_scales != (None, None):
        raise ValueError(f"norm_placement={config.norm_placement!r} with learned skip scales (admin_learnable_omega="
                         "true) does not export: a vector omega does not fold into BERT")  # fmt: skip
    plain_bert = (("norm_type", "layernorm"), ("qk_norm", False), ("embedding_layer_norm", True), ("gpas", False),
                  ("attention_gate", "none"), ("value_residual", "none"))  # fmt: skip
    for key, plain in plain_bert:
        if getattr(config, key) != plain:
            raise ValueError(f"{key}={getattr(config, key)!r} does not export to plain BERT, which has {key}={plain!r}")


def bert_config(config: "LNBertConfig") -> "BertConfig":
    """The Hugging Face BERT config with the same shapes and settings (BERT's own fields only)."""
    from transformers import BertConfig

    bert_keys = set(BertConfig().to_dict()) - {"model_type", "architectures"}
    return BertConfig(**{k: v for k, v in config.to_dict().items() if k in bert_keys})


def export_to_bert(model: "LNBertForPreTraining") -> "BertForPreTraining":
    """The ``BertForPreTraining`` that computes what ``model`` computes (up to LayerNorm's eps)."""
    from transformers import BertForPreTraining

    config = model.config
    check_exportable(config)
    scale = config.layer_parts(0).skip_scale
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for i in range(config.num_hidden_layers):
        for dense in (f"bert.encoder.layer.{i}.attention.output.dense", f"bert.encoder.layer.{i}.output.dense"):
            state[f"{dense}.weight"] /= scale
            state[f"{dense}.bias"] /= scale
    bert = BertForPreTraining(bert_config(config))
    bert.load_state_dict(state, strict=True)
    return bert.eval()


def main(argv: list[str] | None = None) -> int:
    args = parse(ExportConfig, argv, prog="python -m pretrain.export", description=__doc__ or "")
    source, out = Path(args.model), Path(args.out)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"--model={source} is not a model folder (no config.json); pass a snapshot folder")
    if out.exists():
        raise ValueError(f"--out={out} exists; choose a new folder (nothing was written)")
    if (source / MANIFEST_FILE).is_file():  # a snapshot of pretrain/run.py: export only what it wrote
        verify_manifest(source)
    from pretrain.modeling import LNBertForPreTraining

    model = LNBertForPreTraining.from_pretrained(source)
    bert = export_to_bert(model)
    with atomic_dir(out) as tmp:  # readers never see a half-written export; a killed one leaves no folder
        bert.save_pretrained(tmp)
        for item in source.iterdir():  # the snapshot's tokenizer files travel with it
            if item.name.startswith(("tokenizer", "vocab", "special_tokens")):
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
    print(f"exported {model.config.norm_placement} (residual scale {model.config.layer_parts(0).skip_scale:.4g}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
