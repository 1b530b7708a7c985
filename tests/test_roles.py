"""Every config field declares its role (pretrain/common/roles.py), and the lists that resume, the data caches and the
W&B recipe read are derived from the roles. The derived lists are pinned literally (they began as the lists kept by
hand in five modules, main at 936ac5e), and so are the keys computed from them: a change to a list or a key (a cache
key, the data fingerprint, the W&B recipe hash) fails here and is made on purpose."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import pretrain.data.instance_cache as instance_cache
import pretrain.data.tokenizer as tokenizer
from pretrain.common import roles
from pretrain.common.cli import to_dict
from pretrain.common.formats import RUN_FORMAT, stamped
from pretrain.config import RESOLVED_AT_START, RESUMABLE_CHANGES, PretrainConfig, resolved_config
from pretrain.data.config import DataConfig, SourceConfig
from pretrain.data.vocabulary import data_fingerprint
from pretrain.run_folder.layout import RUN_CONFIG_FILE
from pretrain.run_folder.same_run import IDENTICAL_RUN_IGNORES, config_differences
from pretrain.tracking.wandb_logging import _NOT_RECIPE, recipe, short_hash

# --------------------------------------------------------------------------------------------------
# The lists, pinned (as they were written by hand before the roles, main at 936ac5e)
# --------------------------------------------------------------------------------------------------

RESUMABLE_CHANGES_BEFORE = {
    "train.output_dir", "train.resume", "train.max_steps", "train.stop_at_step", "train.eval_every",
    "train.eval_batches", "train.log_every", "train.checkpoint_every", "train.keep_last_checkpoints",
    "train.snapshot_every", "train.snapshot_steps", "train.snapshot_at_start", "train.snapshot_at_end",
    "train.num_workers", "train.peak_flops_per_device", "train.collective_timeout_s", "train.max_skipped_steps",
    "data.num_proc", "data.cache_dir", "data.max_inline_preparation_mb", "train.gradient_checkpointing",
    # The batch split and kernels (role "split"): a run continues on another number of processes at its global batch.
    "train.per_device_batch_size", "train.gradient_accumulation_steps", "train.compile", "optim.implementation",
    "train.hang_timeout_s",  # added since, role "mechanics"
}  # fmt: skip
IDENTICAL_RUN_IGNORES_BEFORE = {
    "train.output_dir", "train.resume", "train.num_workers", "data.num_proc", "data.cache_dir",
    "train.peak_flops_per_device", "train.gradient_checkpointing", "train.hang_timeout_s",
}  # fmt: skip
FIELDS_NOT_IN_INSTANCE_KEY_BEFORE = {
    "mlm_probability", "cache_dir", "num_proc", "streaming", "shuffle_buffer_size", "tokenizer",
    "max_inline_preparation_mb",
}  # fmt: skip
# The sources were in the tokenizer's key before too (by fingerprint, added beside this list); now they are listed.
TOKENIZER_KEY_FIELDS_BEFORE = {
    "vocab_size", "lowercase", "weight_by", "validation_fraction", "validation_documents", "max_documents",
    "tokenizer_train_documents", "streaming",
}  # fmt: skip
DATA_FINGERPRINT_LEFT_OUT_BEFORE = {"num_proc", "cache_dir", "tokenizer", "max_inline_preparation_mb"}
NOT_RECIPE_BEFORE = {
    "train": {"output_dir", "run_name", "seed", "resume", "stop_at_step", "num_workers", "eval_every", "eval_batches",
              "log_every", "checkpoint_every", "keep_last_checkpoints", "snapshot_every", "snapshot_steps",
              "snapshot_at_start", "snapshot_at_end", "compile", "peak_flops_per_device",
              "per_device_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "hang_timeout_s"},
    "data": {"cache_dir", "num_proc"},
    "optim": {"implementation"},
}  # fmt: skip


def test_the_derived_lists_equal_the_hand_kept_ones() -> None:
    assert RESUMABLE_CHANGES == RESUMABLE_CHANGES_BEFORE
    assert IDENTICAL_RUN_IGNORES == IDENTICAL_RUN_IGNORES_BEFORE
    assert instance_cache._FIELDS_NOT_IN_KEY == FIELDS_NOT_IN_INSTANCE_KEY_BEFORE
    assert tokenizer._TOKENIZER_KEY_FIELDS - {"sources"} == TOKENIZER_KEY_FIELDS_BEFORE
    assert "sources" in tokenizer._TOKENIZER_KEY_FIELDS
    assert roles.not_keyed_in(DataConfig, "batches") == DATA_FINGERPRINT_LEFT_OUT_BEFORE  # vocabulary.data_fingerprint's
    assert _NOT_RECIPE == NOT_RECIPE_BEFORE


# --------------------------------------------------------------------------------------------------
# The keys themselves, pinned for the same inputs
# --------------------------------------------------------------------------------------------------


def _fingerprint(source: SourceConfig, index: int) -> dict[str, Any]:
    """Stands in for the sources' file stats (paths, sizes, mtimes): the keys over the config alone."""
    return {**dataclasses.asdict(source), "index": index}


class _Backend:
    def to_str(self) -> str:
        return '{"model": "stub"}'


class _Tokenizer:
    backend_tokenizer = _Backend()

    def get_vocab(self) -> dict[str, int]:
        return {"[PAD]": 0, "[UNK]": 1, "a": 2}


_OTHER_DATA = DataConfig(
    sources=[SourceConfig(kind="json", path="/data/a.jsonl", weight=2.5), SourceConfig(kind="hub", path="x/y")],
    weight_by="words", tokenizer=None, vocab_size=4096, lowercase=False, max_seq_length=96, objective="mlm",
    short_seq_prob=0.2, nsp_random_prob=0.4, mlm_probability=0.2, validation_fraction=0.01,
    validation_documents=7, max_documents=900, tokenizer_train_documents=500, cache_dir="/c", streaming=False,
    shuffle_buffer_size=77, num_proc=3, max_inline_preparation_mb=8.0,
)  # fmt: skip
# CACHE_FORMAT_VERSION enters both cache keys: a deliberate bump changes them, and these values with it (the last,
# to 5: summary.json records each shard's checksum). The data
# fingerprints changed (from b109991157ec0d1f and 78bb2ffc61ea9b2d) when the batch split left them: a data position
# counts sequences, which holds for any number of processes; and (from 2b762b27d94286bf and cc2f9c3b175b44e2) when
# they took in the prepared instances' checksums (None here: none prepared). The recipe
# hashes changed (from f573bf8a and 3c59ba3d) when the residual scheme's six fields joined the model section, and
# (from 0b07e65c and 8be0b38e) when the 2025-26 designs' fields did: the recipe holds every model field, so every
# run's W&B group did too.
KEYS_BEFORE = {
    "default": {"tokenizer_key": "2f4aeeac7ec6d81fbc3f", "instances_key": "90427cd2fcffaac61856",
                "data_fingerprint": "a6ba9d358a6781c3", "recipe_hash": "03640549"},
    "other": {"tokenizer_key": "a0bbd139bf17331a8fad", "instances_key": "aaf5079dd77798978b7a",
              "data_fingerprint": "a82c0a2c938461ae", "recipe_hash": "c0d5c68f"},
}  # fmt: skip


@pytest.mark.parametrize("name", ["default", "other"])
def test_cache_keys_fingerprint_and_recipe_hash_are_pinned(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instance_cache, "source_fingerprint", _fingerprint)
    monkeypatch.setattr(tokenizer, "source_fingerprint", _fingerprint)
    cfg = PretrainConfig() if name == "default" else PretrainConfig(data=_OTHER_DATA)
    assert {
        "tokenizer_key": tokenizer._tokenizer_cache_key(cfg.data, 3),
        "instances_key": instance_cache.data_cache_key(cfg.data, _Tokenizer(), seed=3),
        "data_fingerprint": data_fingerprint(cfg, _Tokenizer(), None),
        "recipe_hash": short_hash(recipe(to_dict(cfg), 64)),
    } == KEYS_BEFORE[name]


def test_every_recipe_field_is_in_the_recipe_hash_at_any_value() -> None:
    """A field's default is a value like any other: the recipe holds every model field, and one changed changes
    the hash."""
    cfg = PretrainConfig()
    assert set(recipe(to_dict(cfg), 64)["model"]) == {f.name for f in dataclasses.fields(cfg.model)}
    default = short_hash(recipe(to_dict(cfg), 64))
    cfg.model.norm_type = "rmsnorm"
    assert short_hash(recipe(to_dict(cfg), 64)) != default
    cfg.model.norm_type, cfg.model.hc_streams = "layernorm", 8  # an option of a scheme not in use is still recipe
    assert short_hash(recipe(to_dict(cfg), 64)) != default


def test_a_null_the_run_decides_is_answered_by_the_saved_value(tmp_path) -> None:
    """model.vocab_size=null is decided at the start (role(..., resolved=True)): before the data is prepared the
    request matches any saved size; the decided size is then compared like any other value."""
    assert {"model.vocab_size", "train.peak_flops_per_device"} == RESOLVED_AT_START
    cfg = PretrainConfig()
    saved = resolved_config(cfg, {"model.vocab_size": 8192, "train.peak_flops_per_device": 0.0})
    assert (saved["model"]["vocab_size"], cfg.model.vocab_size) == (8192, None)
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps(stamped(saved, RUN_FORMAT)))
    assert config_differences(tmp_path, to_dict(cfg), RESUMABLE_CHANGES) == []
    assert config_differences(tmp_path, saved, RESUMABLE_CHANGES) == []
    grown = resolved_config(cfg, {"model.vocab_size": 8193, "train.peak_flops_per_device": 0.0})
    assert config_differences(tmp_path, grown, RESUMABLE_CHANGES) == ["model.vocab_size"]
    cfg.model.vocab_size = 9000  # asked for explicitly: compared as asked
    assert config_differences(tmp_path, to_dict(cfg), RESUMABLE_CHANGES) == ["model.vocab_size"]
    with pytest.raises(KeyError, match=r"optim\.lr"):
        resolved_config(cfg, {"optim.lr": 1.0})
    with pytest.raises(KeyError, match=r"exactly RESOLVED_AT_START"):  # a resolved field left undecided
        resolved_config(cfg, {"model.vocab_size": 8192})


# --------------------------------------------------------------------------------------------------
# A field without a role
# --------------------------------------------------------------------------------------------------


def test_every_config_field_declares_a_role() -> None:
    fields = dict(roles.leaf_fields(PretrainConfig))
    assert {"model.norm_placement", "data.sources", "optim.lr", "train.seed", "tracking.backend"} <= set(fields)
    assert [key for key, f in fields.items() if f.metadata.get("role") not in roles.ROLES] == []
    # A data field also says which keys hold its value: a new one that forgot would silently miss the cache keys.
    assert [f.name for f in dataclasses.fields(DataConfig) if "keyed_in" not in f.metadata] == []


@dataclasses.dataclass
class _Section:
    declared: int = roles.role("recipe", default=1)
    forgotten: int = 2


@dataclasses.dataclass
class _Config:
    section: _Section = dataclasses.field(default_factory=_Section)


@dataclasses.dataclass
class _Data:
    declared: int = roles.role("recipe", keyed_in=("instances",), default=1)
    forgotten: int = roles.role("recipe", default=2)


def test_a_field_without_a_role_is_an_error_that_names_it() -> None:
    with pytest.raises(TypeError, match=r"config field section\.forgotten has no role"):
        roles.keys_where(_Config, lambda rules: rules.resumable)
    with pytest.raises(TypeError, match="data field forgotten does not say which keys hold it"):
        roles.keyed_in(_Data, "instances")
    with pytest.raises(ValueError, match="unknown role 'recpie'"):
        roles.role("recpie", default=0)  # type: ignore[arg-type]
